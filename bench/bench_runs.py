"""Runs `moe-routing bench` several times and summarises each row over the runs.

A shared machine's memory bandwidth drifts between phases of seconds to minutes (on the VM these
numbers were taken on, memcpy ran anywhere between 30 and 55 GB/s). Every bench row already
pairs its time with bandwidth measured next to it; this script repeats the whole sweep so that
a reader sees the spread of "% of copy" across phases, not one draw:

    .venv/bin/python bench/bench_runs.py --runs 5 --tokens 1024,4096 --csv-dir bench/out

Prints, per operator, scenario, shape and token count: the median, minimum and maximum over the
runs of the fraction of copy bandwidth and of the row's limit (see `moe-routing bench --help`),
the median of the highest fraction of copy the bandwidths measured next to the row allow (a
kernel reaching its limit), the same median and range of the limit's fraction for the call into
fresh outputs (the torch binding's functional call), and the copy bandwidth each was measured
against. Any other flag is passed to the bench.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile


def run_once(binary: str, bench_args: list[str], csv_path: str) -> list[dict]:
    cmd = [binary, "bench", *bench_args, "--csv", csv_path]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_runs: {' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    with open(csv_path, newline="") as f:
        return list(csv.DictReader(f))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="how many times to run the sweep (default 5)")
    parser.add_argument("--binary", default="build/moe-routing", help="the CLI (default build/moe-routing)")
    parser.add_argument("--csv-dir", help="keep each run's CSV here (default: a temporary directory)")
    args, bench_args = parser.parse_known_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    if not os.access(args.binary, os.X_OK):
        parser.error(f"--binary {args.binary} is not an executable: run `make build` first")

    directory = args.csv_dir or tempfile.mkdtemp(prefix="bench_runs_")
    os.makedirs(directory, exist_ok=True)
    rows: dict[tuple, list[dict]] = {}
    for r in range(args.runs):
        print(f"[bench_runs {r + 1}/{args.runs}] {args.binary} bench {' '.join(bench_args)}", file=sys.stderr, flush=True)
        for row in run_once(args.binary, bench_args, os.path.join(directory, f"run{r + 1}.csv")):
            key = (row["op"], row["scenario"], row["shape"], int(row["tokens"]))
            rows.setdefault(key, []).append(row)

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values) * 100:5.1f}% ({min(values) * 100:.1f}-{max(values) * 100:.1f})"

    print(f"moe-routing bench, {args.runs} runs: median and range over the runs (CSV files in {directory})")
    print(f"{'op':<13} {'scenario':<9} {'shape':<12} {'N':>5}  {'% of copy (med, min-max)':<25} "
          f"{'max % of copy (med)':<20} {'% of limit (med, min-max)':<25} {'fresh: % of limit':<25} "
          "copy GB/s (min-max)")
    for key, group in rows.items():
        copy = [float(g["copy_gbps"]) for g in group]
        # A bench older than the ceiling column (--binary) has none: n/a.
        ceilings = [float(g["ceiling_fraction_of_copy"]) for g in group if g.get("ceiling_fraction_of_copy")]
        ceiling = f"{statistics.median(ceilings) * 100:5.1f}%" if ceilings else "  n/a"
        # The fresh-output call (the torch binding's) against the same limit; n/a as above.
        fresh = [float(g["fresh_fraction_of_limit"]) for g in group if g.get("fresh_fraction_of_limit")]
        fresh_limit = spread(fresh) if fresh else "  n/a"
        print(f"{key[0]:<13} {key[1]:<9} {key[2]:<12} {key[3]:>5}  "
              f"{spread([float(g['fraction_of_copy']) for g in group]):<25} "
              f"{ceiling:<20} "
              f"{spread([float(g['fraction_of_limit']) for g in group]):<25} "
              f"{fresh_limit:<25} "
              f"{min(copy):.0f}-{max(copy):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
