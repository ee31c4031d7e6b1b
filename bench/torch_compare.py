"""Our torch operators against the best plain-PyTorch eager expression of the same semantics, in
one process and one run, with a plot of GB/s against tokens.

    .venv/bin/python bench/torch_compare.py                      # default sweep, ~1 minute
    .venv/bin/python bench/torch_compare.py --shapes deepseek-v3 --tokens 1,128,4096 --plot out.png

Backward (moe_init_routing_grad, dropless): PyTorch as index_select + view + sum, and as
index_add_ into a zeroed buffer; the faster of the two per shape is "torch best".
Forward (moe_init_routing, dropless, per-expert counts): stable argsort + index_select + bincount
+ the inverse permutation. Outputs are preallocated wherever PyTorch takes out=, and ours are
preallocated too (out=); "ours alloc" times our operators allocating their outputs, which on the
CPU pays the page faults of fresh memory on every call.
Bytes are counted as in `moe-routing bench`: each input read once, each output written once.
Every run calls each contender once, interleaved, and the speedup is the median over the runs of
the ratio within a run, so each ratio is a paired measurement ("ours alloc" is timed on its own:
the page faults and unmaps of its fresh outputs would slow whichever contender ran next). Each
timed call is prepared the same way whoever ran before it: the cache scrubbed (64 MiB read,
untimed) for calls moving >= 64 MiB, warmed (the same call once more, untimed) for smaller ones;
--no-scrub: neither.
"""
from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time

import torch

import moe_routing

SHAPES = {  # hidden, experts, top_k
    "deepseek-v3": (7168, 256, 8),
    "qwen3-235b": (4096, 128, 8),
    "qwen3-30b": (2048, 128, 8),
    "mixtral": (4096, 8, 2),
}


# Calls moving at least this many bytes start from a scrubbed cache, smaller ones warm (see
# run_times), as the rows of `moe-routing bench` that are / are not paired with a bandwidth
# measurement do.
SCRUB_FROM_BYTES = 64 << 20
_scrub_buffer = None


def scrub_cache():
    """Reads 64 MiB (twice the last-level cache of the machines measured), so that the lines left
    dirty by the previous call are written back now, untimed, rather than during the next one."""
    global _scrub_buffer
    if _scrub_buffer is None:
        _scrub_buffer = torch.ones(16 << 20, dtype=torch.float32)
    _scrub_buffer.sum()


def run_times(fns, runs, min_seconds=0.3, max_runs=501, start=None):
    """The times of each function's runs, measured interleaved: every run calls each function once
    (rotating which goes first), so a shared machine drifting between phases - its bandwidth
    changes by tens of percent over seconds - slows all of them alike and the ratios hold.
    At least `runs` runs, and more for fast calls (up to max_runs), so that each function runs for
    about min_seconds on average: a median of 7 sub-millisecond calls moved by 20% between runs.

    `start` prepares every timed call of every contender the same way: "scrubbed" (64 MiB read
    first, untimed) or "warm" (the same call made once more first, untimed); None: nothing.
    Interleaved calls need one: PyTorch's operators write through the cache and leave up to a
    cache's worth of dirty lines (and index_select+sum a whole intermediate), ours stream large
    outputs past it, so whichever call came next paid for the previous one's write-backs and
    evictions - always ours, since each of ours follows a PyTorch call."""
    for fn in fns:
        fn()  # warm-up (also faults in any output pages)
    t0 = time.perf_counter()
    for fn in fns:
        fn()
    per_run = max(time.perf_counter() - t0, 1e-9)
    runs = max(runs, min(max_runs, math.ceil(min_seconds * len(fns) / per_run)))
    times = [[] for _ in fns]
    for r in range(runs):
        for k in range(len(fns)):
            i = (r + k) % len(fns)
            if start == "scrubbed":
                scrub_cache()
            elif start == "warm":
                fns[i]()
            t0 = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t0)
    return times


def paired_speedup(ours, theirs):
    """Median over the runs of their time / our time in the same run: calls of one run are
    adjacent in time, so each ratio sees one phase of a shared machine."""
    return statistics.median(t / o for o, t in zip(ours, theirs))


def routing(n, k, e, gen):
    # k distinct experts per token, skewed toward low ids like a trained router
    weights = 1.0 / torch.sqrt(torch.arange(1, e + 1, dtype=torch.float32))
    return torch.multinomial(weights.expand(n, e), k, replacement=False, generator=gen).to(torch.int32)


def start_state(bytes_moved, no_scrub=False):
    """Large calls (their data far beyond the caches) start from a scrubbed cache, smaller ones
    warm, as in `moe-routing bench`; --no-scrub: neither (the previous contender's state)."""
    if no_scrub:
        return None
    return "scrubbed" if bytes_moved >= SCRUB_FROM_BYTES else "warm"


def measure(shape, n, dtype, runs, gen, no_scrub=False):
    h, e, k = SHAPES[shape]
    esize = torch.empty((), dtype=dtype).element_size()
    idx = routing(n, k, e, gen)
    x = torch.randn(n, h, generator=gen).to(dtype)
    results = []

    # ---- forward ----
    expanded_x, eri, counts, _, _ = moe_routing.moe_init_routing(
        x, idx, expert_num=e, expert_tokens_num_type=1, expert_tokens_num_flag=True)
    fwd_bytes = n * h * esize + n * k * 4 + n * k * h * esize + n * k * 4 + e * 8

    def ours_forward_alloc():
        moe_routing.moe_init_routing(x, idx, expert_num=e, expert_tokens_num_type=1, expert_tokens_num_flag=True)

    fwd_out = tuple(torch.empty_like(t) for t in moe_routing.moe_init_routing(
        x, idx, expert_num=e, expert_tokens_num_type=1, expert_tokens_num_flag=True))

    def ours_forward():
        moe_routing.moe_init_routing(x, idx, expert_num=e, expert_tokens_num_type=1, expert_tokens_num_flag=True,
                                     out=fwd_out)

    out_x = torch.empty(n * k, h, dtype=dtype)
    positions = torch.arange(n * k, dtype=torch.int32)
    out_eri = torch.empty(n * k, dtype=torch.int32)

    def torch_forward():
        flat = idx.view(-1)
        order = torch.argsort(flat, stable=True)
        torch.index_select(x, 0, order // k, out=out_x)
        torch.bincount(flat, minlength=e)
        out_eri.index_copy_(0, order, positions)

    # the torch expression computes the same thing: check once
    torch_forward()
    assert torch.equal(out_x, expanded_x) and torch.equal(out_eri, eri), "forward outputs differ"
    start = start_state(fwd_bytes, no_scrub)
    ours_times, torch_times = run_times([ours_forward, torch_forward], runs, start=start)
    (alloc_times,) = run_times([ours_forward_alloc], runs, start=start)  # apart: its page faults and unmaps
    # would disturb whichever contender runs next
    results.append(dict(op="forward", shape=shape, tokens=n, ours_s=statistics.median(ours_times),
                        ours_alloc_s=statistics.median(alloc_times), torch_s=statistics.median(torch_times),
                        torch_expr="argsort+index_select+bincount", bytes=fwd_bytes,
                        speedup=paired_speedup(ours_times, torch_times)))

    # ---- backward ----
    g = torch.randn(n * k, h, generator=gen).to(dtype)
    bwd_bytes = n * k * h * esize + n * k * 4 + n * h * esize
    eri_long = eri.long()
    token_of_row = torch.empty(n * k, dtype=torch.long)
    token_of_row[eri_long] = torch.arange(n * k) // k
    gathered = torch.empty(n * k, h, dtype=dtype)
    out_sum = torch.empty(n, h, dtype=dtype)
    out_add = torch.empty(n, h, dtype=dtype)

    grad_out = torch.empty(n, h, dtype=dtype)

    def ours_backward():
        moe_routing.moe_init_routing_grad(g, eri, k, out=grad_out)

    def ours_backward_alloc():
        moe_routing.moe_init_routing_grad(g, eri, k)

    def torch_select_sum():
        torch.index_select(g, 0, eri_long, out=gathered)
        torch.sum(gathered.view(n, k, h), dim=1, out=out_sum)

    def torch_index_add():
        out_add.zero_()
        out_add.index_add_(0, token_of_row, g)

    start = start_state(bwd_bytes, no_scrub)
    ours_times, sel_times, add_times = run_times([ours_backward, torch_select_sum, torch_index_add], runs,
                                                 start=start)
    (alloc_times,) = run_times([ours_backward_alloc], runs, start=start)
    best, expr = ((sel_times, "index_select+view+sum") if statistics.median(sel_times) <= statistics.median(add_times)
                  else (add_times, "index_add_"))
    results.append(dict(op="backward", shape=shape, tokens=n, ours_s=statistics.median(ours_times),
                        ours_alloc_s=statistics.median(alloc_times), torch_s=statistics.median(best),
                        torch_expr=expr, bytes=bwd_bytes, speedup=paired_speedup(ours_times, best)))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="deepseek-v3,qwen3-235b,qwen3-30b,mixtral")
    parser.add_argument("--tokens", default="1,16,128,1024,4096")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--runs", type=int, default=7,
                        help="runs per measurement at least (fast calls get more, up to 501: ~0.3 s each)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    parser.add_argument("--plot", default="", help="write a PNG plot of GB/s against tokens")
    parser.add_argument("--csv", default="")
    parser.add_argument("--no-scrub", action="store_true",
                        help="time each call from whatever state the previous contender left the caches "
                             "in, instead of scrubbed (>= 64 MiB moved) or warm (smaller) (see run_times)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    shapes = args.shapes.split(",")
    tokens = [int(t) for t in args.tokens.split(",")]
    gen = torch.Generator().manual_seed(0)
    rows = []
    total = len(shapes) * len(tokens)
    for shape in shapes:
        if shape not in SHAPES:
            parser.error(f"--shapes: unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
        for n in tokens:
            print(f"[torch_compare {len(rows) // 2 + 1}/{total}] {shape} N={n}", file=sys.stderr, flush=True)
            rows.extend(measure(shape, n, dtype, args.runs, gen, no_scrub=args.no_scrub))
    print(f"moe_routing vs PyTorch {torch.__version__} eager, {args.dtype}, {torch.get_num_threads()} threads, "
          f"median of >= {args.runs} runs (calls under ~40 ms: more, ~0.3 s of each); "
          f"{'no cache scrub' if args.no_scrub else 'each call starts from a scrubbed cache (>= 64 MiB moved) or warm'}")
    print(f"{'op':9} {'shape':12} {'N':>6} {'ours ms':>9} {'alloc ms':>9} {'torch ms':>9} {'ours GB/s':>10} "
          f"{'torch GB/s':>11} {'speedup':>8}  torch expression")
    for r in rows:
        r["ours_gbps"] = r["bytes"] / r["ours_s"] / 1e9
        r["torch_gbps"] = r["bytes"] / r["torch_s"] / 1e9
        print(f"{r['op']:9} {r['shape']:12} {r['tokens']:6d} {r['ours_s'] * 1e3:9.3f} "
              f"{r['ours_alloc_s'] * 1e3:9.3f} {r['torch_s'] * 1e3:9.3f} "
              f"{r['ours_gbps']:10.2f} {r['torch_gbps']:11.2f} {r['speedup']:7.2f}x  {r['torch_expr']}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            writer.writeheader()
            writer.writerows(rows)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        for ax, op in zip(axes, ["forward", "backward"]):
            for shape in shapes:
                sel = [r for r in rows if r["op"] == op and r["shape"] == shape]
                line, = ax.plot([r["tokens"] for r in sel], [r["ours_gbps"] for r in sel], "o-", label=f"ours {shape}")
                ax.plot([r["tokens"] for r in sel], [r["torch_gbps"] for r in sel], "x--", color=line.get_color(),
                        label=f"torch {shape}")
            ax.set_xscale("log")
            ax.set_xlabel("tokens")
            ax.set_ylabel("GB/s (bytes that must move / time)")
            ax.set_title(f"moe_init_routing{'_grad' if op == 'backward' else ''} ({args.dtype}, "
                         f"{torch.get_num_threads()} threads)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
