"""bench/bench_runs.py: repeats `moe-routing bench` and summarises each row over the runs."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("MOE_ROUTING_CLI", os.path.join(ROOT, "build", "moe-routing"))
SCRIPT = os.path.join(ROOT, "bench", "bench_runs.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT)


def test_summarises_every_row_over_the_runs(tmp_path):
    assert os.access(CLI, os.X_OK), f"{CLI} missing: `make build` first (or set MOE_ROUTING_CLI)"
    done = run("--runs", "2", "--binary", CLI, "--csv-dir", str(tmp_path),
               "--op", "init-routing", "--shape", "mixtral", "--tokens", "1")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("init-routing")]
    assert [line.split()[1] for line in lines] == ["dropless", "drop_pad"]
    for line in lines:
        fields = line.split()
        assert fields[2:4] == ["mixtral", "1"]
        assert fields[4].endswith("%") and float(fields[4][:-1]) > 0
        low, high = (float(v) for v in fields[5].strip("()").split("-"))  # the range over the runs
        assert 0 < low <= float(fields[4][:-1]) <= high
        # The median ceiling (highest % of copy the measured bandwidths allow): in (0, 100].
        assert fields[6].endswith("%") and 0 < float(fields[6][:-1]) <= 100
        # The % of limit (med, range), then the fresh-output call's, each a median within its range.
        for at in (7, 9):
            assert fields[at].endswith("%"), line
            low, high = (float(v) for v in fields[at + 1].strip("()").split("-"))
            assert 0 < low <= float(fields[at][:-1]) <= high, line
    assert sorted(os.listdir(tmp_path)) == ["run1.csv", "run2.csv"]
    assert "[bench_runs 2/2]" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["--runs", "0"], "--runs must be >= 1, got 0"),
    (["--binary", "/nonexistent/moe-routing"], "--binary /nonexistent/moe-routing is not an executable"),
])
def test_bad_arguments_are_refused(args, message):
    done = run(*args)
    assert done.returncode != 0 and message in done.stderr


def test_a_failing_bench_is_reported_with_its_message():
    done = run("--runs", "1", "--binary", CLI, "--shape", "bogus")
    assert done.returncode != 0
    assert "--shape must be one of" in done.stderr and "failed" in done.stderr
