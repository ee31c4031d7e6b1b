"""Our torch operators against the best plain-PyTorch eager expression of the same semantics, in
one process and one run, with a plot of GB/s against tokens.

    .venv/bin/python bench/torch_compare.py                      # default sweep, a few minutes
    .venv/bin/python bench/torch_compare.py --shapes deepseek-v3 --tokens 1,128,4096 --plot out.png
    .venv/bin/python bench/torch_compare.py --ops combine        # only the combine's rows

Token counts 1..128 are decode sizes, 1024..4096 training sizes. Rows, per shape and token count:
The dispatch (--ops dispatch):
  forward   moe_init_routing, dropless, per-expert counts: PyTorch as stable argsort + index_select
            + bincount + the inverse permutation.
  backward  moe_init_routing_grad, dropless: PyTorch as index_select + view + sum, and as
            index_add_ into a zeroed buffer.
The combine (--ops combine), the activations in --dtype with float32 routing weights (float32 with
bf16, as MoE layers run it; the activations' dtype otherwise):
  combine           moe_finalize_routing, drop_pad_mode 2 (what moe_init_routing's index is):
                    out[i] = sum_t scales[i, t] * y[expanded_row_idx[i*K + t]], accumulated in
                    float32. PyTorch as index_select + mul + sum, as index_select + bmm, and as
                    index_add_ of the weighted rows into a float32 buffer.
  combine_backward  moe_finalize_routing_grad: grad_expanded_x (grad_y of each row's token times
                    its weight) and grad_scales (each pair's dot product of its row and grad_y).
                    PyTorch gathering grad_y per row (index_select, mul, sum, index_copy_ of the
                    sums to pair order), and gathering the rows per pair (index_select, mul, sum,
                    index_copy_ of the row gradients to row order).
Where PyTorch has more than one expression the faster per shape is "torch best". Every row is
measured two ways:
  out=        outputs preallocated, wherever PyTorch takes out=, and ours too (out=);
  functional  what a training step calls: ours without out= (new outputs; the binding asks for huge
              pages for them, MOE_ROUTING_HUGE_PAGES=0 turns that off) against the same PyTorch
              expressions allocating theirs. Each call's outputs are freed before the next call.
              New CPU memory costs a page fault and the OS zeroing each page on first touch, so
              this is the time a training step sees.
--thp default,1 (the default) measures the functional calls under the machine's THP mode and again
with PyTorch's THP_MEM_ALLOC_ENABLE=1 (huge pages for every large PyTorch CPU tensor, ours and
theirs), each in a process of its own (PyTorch reads it once); `--thp default` or `--thp 1` alone
runs in this process.
Bytes are counted as in `moe-routing bench`: each input read once, each output written once.
Every run calls each contender once, interleaved, and the speedups are medians over the runs of the
ratio within a run, so each ratio is a paired measurement. Each timed call is prepared the same way
whoever ran before it: the cache scrubbed (64 MiB read, untimed) for calls moving >= 64 MiB, warmed
(the same call once more, untimed) for smaller ones; --no-scrub: neither.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import tempfile
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


def best_of(named_times):
    """(times, name) of the expression with the smallest median."""
    return min(named_times, key=lambda pair: statistics.median(pair[0]))


def fresh_or_given(fresh):
    """The buffers an expression writes: new ones for every call (functional) or the given ones."""
    return torch.empty_like if fresh else (lambda t: t)


def compare(op, shape, n, ours, ours_functional, torch_out, torch_functional, runs, start, bytes_moved):
    """Times, interleaved run by run, our out= call, our functional call and PyTorch's expressions
    (name -> fn) with preallocated and with new buffers; the result row of the fastest PyTorch
    expression of each kind."""
    names = list(torch_out)
    times = run_times([ours, ours_functional] + [torch_out[e] for e in names] +
                      [torch_functional[e] for e in names], runs, start=start)
    ours_times, fresh_times = times[0], times[1]
    best, expr = best_of(list(zip(times[2:2 + len(names)], names)))
    best_fresh, fresh_expr = best_of(list(zip(times[2 + len(names):], names)))
    return dict(op=op, shape=shape, tokens=n, ours_s=statistics.median(ours_times), torch_s=statistics.median(best),
                speedup=paired_speedup(ours_times, best), torch_expr=expr,
                ours_fresh_s=statistics.median(fresh_times), torch_fresh_s=statistics.median(best_fresh),
                fresh_speedup=paired_speedup(fresh_times, best_fresh),
                fresh_over_out=paired_speedup(ours_times, fresh_times), torch_fresh_expr=fresh_expr,
                bytes=bytes_moved)


def measure_dispatch(shape, n, dtype, runs, gen, no_scrub=False):
    h, e, k = SHAPES[shape]
    esize = torch.empty((), dtype=dtype).element_size()
    idx = routing(n, k, e, gen)
    x = torch.randn(n, h, generator=gen).to(dtype)
    results = []

    # ---- forward ----
    kwargs = dict(expert_num=e, expert_tokens_num_type=1, expert_tokens_num_flag=True)
    expanded_x, eri, counts, _, _ = moe_routing.moe_init_routing(x, idx, **kwargs)
    fwd_bytes = n * h * esize + n * k * 4 + n * k * h * esize + n * k * 4 + e * 8
    fwd_out = tuple(torch.empty_like(t) for t in moe_routing.moe_init_routing(x, idx, **kwargs))
    out_x = torch.empty(n * k, h, dtype=dtype)
    positions = torch.arange(n * k, dtype=torch.int32)
    out_eri = torch.empty(n * k, dtype=torch.int32)

    def torch_forward(fresh):
        new = fresh_or_given(fresh)

        def fn():
            flat = idx.view(-1)
            order = torch.argsort(flat, stable=True)
            ex = torch.index_select(x, 0, order // k, out=new(out_x))
            torch.bincount(flat, minlength=e)
            return ex, new(out_eri).index_copy_(0, order, torch.arange(n * k, dtype=torch.int32) if fresh else positions)
        return fn

    # the torch expressions compute the same thing: check once
    for fresh in (False, True):
        got_x, got_eri = torch_forward(fresh)()
        assert torch.equal(got_x, expanded_x) and torch.equal(got_eri, eri), "forward outputs differ"
    results.append(compare(
        "forward", shape, n, lambda: moe_routing.moe_init_routing(x, idx, **kwargs, out=fwd_out),
        lambda: moe_routing.moe_init_routing(x, idx, **kwargs),
        {"argsort+index_select+bincount": torch_forward(False)},
        {"argsort+index_select+bincount": torch_forward(True)}, runs, start_state(fwd_bytes, no_scrub), fwd_bytes))

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

    def torch_select_sum(fresh):
        new = fresh_or_given(fresh)

        def fn():
            selected = torch.index_select(g, 0, eri_long, out=new(gathered))
            return torch.sum(selected.view(n, k, h), dim=1, out=new(out_sum))
        return fn

    def torch_index_add(fresh):
        new = fresh_or_given(fresh)
        return lambda: new(out_add).zero_().index_add_(0, token_of_row, g)

    expressions = {"index_select+view+sum": torch_select_sum, "index_add_": torch_index_add}
    results.append(compare(
        "backward", shape, n, lambda: moe_routing.moe_init_routing_grad(g, eri, k, out=grad_out),
        lambda: moe_routing.moe_init_routing_grad(g, eri, k),
        {name: make(False) for name, make in expressions.items()},
        {name: make(True) for name, make in expressions.items()}, runs, start_state(bwd_bytes, no_scrub), bwd_bytes))
    return results


def combine_case(shape, n, dtype, gen):
    """The combine's inputs as an MoE layer has them: expert outputs in moe_init_routing's row
    order (sorted by expert) and its row-layout index, routing weights per (token, choice)."""
    h, e, k = SHAPES[shape]
    idx = routing(n, k, e, gen)
    eri = moe_routing.moe_init_routing(torch.empty(n, 0, dtype=dtype), idx, expert_num=e)[1]
    scales_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
    scales = torch.rand(n, k, generator=gen).to(scales_dtype)
    # The index's inverse, for PyTorch's expressions: row d holds pair pair_of_row[d].
    eri_long = eri.long()
    pair_of_row = torch.empty_like(eri_long)
    pair_of_row[eri_long] = torch.arange(n * k)
    return dict(y=torch.randn(n * k, h, generator=gen).to(dtype), eri=eri, scales=scales, n=n, h=h, k=k,
                eri_long=eri_long, pair_of_row=pair_of_row, token_of_row=pair_of_row // k,
                scale_of_row=scales.reshape(-1)[pair_of_row].float())


def combine_torch_forward(case, fresh=False):
    """The PyTorch eager expressions of the combine's forward: name -> a function writing `out`
    (`fresh`: writing new tensors of every buffer's shape on each call instead)."""
    new = fresh_or_given(fresh)
    y, scales, n, h, k = (case[key] for key in ("y", "scales", "n", "h", "k"))
    eri_long, token_of_row, scale_of_row = case["eri_long"], case["token_of_row"], case["scale_of_row"]
    gathered = torch.empty(n * k, h, dtype=y.dtype)
    products = torch.empty(n, k, h)
    sums = torch.empty(n, h)
    weighted = torch.empty(n * k, h)
    w = scales.float().view(n, 1, k)
    out = torch.empty(n, h, dtype=y.dtype)

    def select_mul_sum():
        g = torch.index_select(y, 0, eri_long, out=new(gathered))
        p = torch.mul(g.view(n, k, h), w.view(n, k, 1), out=new(products))
        return new(out).copy_(torch.sum(p, dim=1, out=new(sums)))

    def select_bmm():
        g = torch.index_select(y, 0, eri_long, out=new(gathered))
        s = new(sums)
        torch.bmm(w, g.view(n, k, h).float(), out=s.view(n, 1, h))
        return new(out).copy_(s)

    def index_add():
        weighted_rows = torch.mul(y, scale_of_row[:, None], out=new(weighted))
        return new(out).copy_(new(sums).zero_().index_add_(0, token_of_row, weighted_rows))

    return out, {"index_select+mul+sum": select_mul_sum, "index_select+bmm": select_bmm, "index_add_": index_add}


def combine_torch_backward(case, grad_y, fresh=False):
    """The PyTorch eager expressions of the combine's backward: name -> a function writing
    (grad_expanded_x, grad_scales) (`fresh`: new tensors on each call instead)."""
    new = fresh_or_given(fresh)
    y, scales, n, h, k = (case[key] for key in ("y", "scales", "n", "h", "k"))
    eri_long, pair_of_row, token_of_row = case["eri_long"], case["pair_of_row"], case["token_of_row"]
    scale_of_row = case["scale_of_row"]
    grad_x = torch.empty(n * k, h, dtype=y.dtype)
    grad_scales = torch.empty(n, k, dtype=scales.dtype)
    gathered = torch.empty(n * k, h, dtype=y.dtype)
    gathered_grad = torch.empty(n * k, h)
    products = torch.empty(n * k, h)
    sums = torch.empty(n * k)
    pair_grads = torch.empty(n * k, h, dtype=y.dtype)

    # Products in float32, as ours: one operand of each multiplication is float32 (a 16-bit by
    # 16-bit product would be rounded to 16 bits first).
    def per_row():  # grad_y gathered to row order: the row gradients land in place
        gg = torch.index_select(grad_y.float(), 0, token_of_row, out=new(gathered_grad))
        p = torch.mul(gg, scale_of_row[:, None], out=new(products))
        gx = new(grad_x).copy_(p)
        p = torch.mul(y, gg, out=new(products))
        s = torch.sum(p, dim=1, out=new(sums))
        gs = new(grad_scales)
        gs.view(-1).index_copy_(0, pair_of_row, s.to(grad_scales.dtype))
        return gx, gs

    def per_pair():  # rows gathered to pair order: grad_scales lands in place
        g = torch.index_select(y, 0, eri_long, out=new(gathered))
        p = new(products)
        torch.mul(g.view(n, k, h), grad_y.float().view(n, 1, h), out=p.view(n, k, h))
        s = new(sums)
        torch.sum(p.view(n, k, h), dim=2, out=s.view(n, k))
        gs = new(grad_scales).copy_(s.view(n, k))
        p = new(products)
        torch.mul(grad_y.view(n, 1, h), scales.float().view(n, k, 1), out=p.view(n, k, h))
        return new(grad_x).index_copy_(0, eri_long, new(pair_grads).copy_(p)), gs

    return (grad_x, grad_scales), {"index_select(grad_y)+mul+sum": per_row, "index_select(rows)+mul+sum": per_pair}


def measure_combine(shape, n, dtype, runs, gen, no_scrub=False):
    case = combine_case(shape, n, dtype, gen)
    y, eri, scales, h, k = case["y"], case["eri"], case["scales"], case["h"], case["k"]
    esize, ssize = y.element_size(), scales.element_size()
    results = []

    # ---- forward ----
    fwd_bytes = n * k * h * esize + n * k * 4 + n * k * ssize + n * h * esize
    out = torch.empty(n, h, dtype=dtype)

    def ours_forward():
        moe_routing.moe_finalize_routing(y, eri, scales=scales, drop_pad_mode=2, out=out)

    torch_out, expressions = combine_torch_forward(case)
    ours_forward()
    for fn in expressions.values():  # the same math, summed in other orders: equal to rounding
        fn()
        torch.testing.assert_close(torch_out.float(), out.float(), rtol=2e-2, atol=1e-2)
    results.append(compare(
        "combine", shape, n, ours_forward,
        lambda: moe_routing.moe_finalize_routing(y, eri, scales=scales, drop_pad_mode=2), expressions,
        combine_torch_forward(case, fresh=True)[1], runs, start_state(fwd_bytes, no_scrub), fwd_bytes))

    # ---- backward ----
    grad_y = torch.randn(n, h, generator=gen).to(dtype)
    bwd_bytes = n * h * esize + n * k * 4 + 2 * n * k * h * esize + 2 * n * k * ssize
    outs = (torch.empty(n * k, h, dtype=dtype), torch.empty(n, k, dtype=scales.dtype))

    def ours_backward():
        moe_routing.moe_finalize_routing_grad(grad_y, eri, y, scales, out=outs)

    torch_outs, expressions = combine_torch_backward(case, grad_y)
    ours_backward()
    for fn in expressions.values():
        fn()
        # A row's gradient is one float32 product rounded once: the same bits; grad_scales' sums
        # over H are in other orders.
        assert torch.equal(torch_outs[0], outs[0]), "combine backward: grad_expanded_x differs"
        torch.testing.assert_close(torch_outs[1], outs[1], rtol=1e-3, atol=1e-3)
    results.append(compare(
        "combine_backward", shape, n, ours_backward,
        lambda: moe_routing.moe_finalize_routing_grad(grad_y, eri, y, scales), expressions,
        combine_torch_backward(case, grad_y, fresh=True)[1], runs, start_state(bwd_bytes, no_scrub), bwd_bytes))
    return results


MEASURES = {"dispatch": measure_dispatch, "combine": measure_combine}


THP_SETTINGS = ("default", "1")
FLOAT_FIELDS = ("ours_s", "torch_s", "speedup", "ours_fresh_s", "torch_fresh_s", "fresh_speedup", "fresh_over_out")


def current_thp_setting():
    """This process's PyTorch huge-page setting: "1" with THP_MEM_ALLOC_ENABLE=1, else "default"."""
    return "1" if os.environ.get("THP_MEM_ALLOC_ENABLE") == "1" else "default"


def measure_in_children(argv, settings):
    """The rows of each THP setting, each measured by this script in a process of its own (PyTorch
    reads THP_MEM_ALLOC_ENABLE once per process); progress goes to stderr as it comes."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="torch_compare_") as directory:
        for setting in settings:
            path = os.path.join(directory, f"thp_{setting}.csv")
            env = dict(os.environ)
            env.pop("THP_MEM_ALLOC_ENABLE", None)
            if setting == "1":
                env["THP_MEM_ALLOC_ENABLE"] = "1"
            child = [a for a in argv]
            done = subprocess.run([sys.executable, os.path.abspath(__file__), *child, "--thp", setting,
                                   "--csv", path, "--plot", ""], env=env, stdout=subprocess.DEVNULL)
            if done.returncode != 0:
                sys.exit(f"torch_compare: the run with --thp {setting} failed ({done.returncode})")
            with open(path, newline="") as f:
                for r in csv.DictReader(f):
                    r["tokens"] = int(r["tokens"])
                    r["bytes"] = int(r["bytes"])
                    for field in FLOAT_FIELDS:
                        r[field] = float(r[field])
                    rows.append(r)
    return rows


def print_table(rows, settings, args):
    """One line per operator, shape and token count: the out= columns (of the first setting's run),
    then the functional columns of each setting."""
    print(f"moe_routing vs PyTorch {torch.__version__} eager, {args.dtype}, {torch.get_num_threads()} threads, "
          f"median of >= {args.runs} runs (calls under ~40 ms: more, ~0.3 s of each); "
          f"{'no cache scrub' if args.no_scrub else 'each call starts from a scrubbed cache (>= 64 MiB moved) or warm'}")
    print("out=: outputs preallocated (ours and PyTorch's); functional: new outputs on every call, freed after it; "
          "x out=: our functional call's time over our out= call's; speedup: PyTorch's time over ours "
          "(medians of per-run ratios); THP default: the machine's mode, THP 1: THP_MEM_ALLOC_ENABLE=1")
    header = f"{'op':16} {'shape':12} {'N':>6} | {'ours ms':>8} {'torch ms':>8} {'speedup':>7}"
    for setting in settings:
        header += f" | THP {setting:7} {'ours ms':>8} {'x out=':>6} {'torch ms':>8} {'speedup':>7}"
    print(header + " | torch expression (out=; functional)")
    by_key = {}
    for r in rows:
        by_key.setdefault((r["op"], r["shape"], r["tokens"]), {})[r["thp"]] = r
    for (op, shape, n), per_setting in by_key.items():
        first = per_setting[settings[0]]
        line = (f"{op:16} {shape:12} {n:6d} | {first['ours_s'] * 1e3:8.3f} {first['torch_s'] * 1e3:8.3f} "
                f"{first['speedup']:6.2f}x")
        exprs = [first["torch_expr"]]
        for setting in settings:
            r = per_setting[setting]
            line += (f" | {'':11} {r['ours_fresh_s'] * 1e3:8.3f} {r['fresh_over_out']:5.2f}x "
                     f"{r['torch_fresh_s'] * 1e3:8.3f} {r['fresh_speedup']:6.2f}x")
            exprs.append(r["torch_fresh_expr"])
        print(line + " | " + "; ".join(dict.fromkeys(exprs)))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="deepseek-v3,qwen3-235b,qwen3-30b,mixtral")
    parser.add_argument("--ops", default="dispatch,combine",
                        help="which operators' rows: dispatch (forward, backward), combine (combine, "
                             "combine_backward)")
    parser.add_argument("--tokens", default="1,16,128,1024,4096")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--runs", type=int, default=7,
                        help="runs per measurement at least (fast calls get more, up to 501: ~0.3 s each)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    parser.add_argument("--thp", default=",".join(THP_SETTINGS),
                        help="PyTorch huge-page settings to measure the functional calls under: default (the "
                             "machine's THP mode), 1 (THP_MEM_ALLOC_ENABLE=1); several: one process each")
    parser.add_argument("--plot", default="", help="write a PNG plot of GB/s against tokens")
    parser.add_argument("--csv", default="")
    parser.add_argument("--no-scrub", action="store_true",
                        help="time each call from whatever state the previous contender left the caches "
                             "in, instead of scrubbed (>= 64 MiB moved) or warm (smaller) (see run_times)")
    args = parser.parse_args(argv)
    settings = args.thp.split(",")
    for setting in settings:
        if setting not in THP_SETTINGS:
            parser.error(f"--thp: unknown setting {setting!r}; choose from {', '.join(THP_SETTINGS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    shapes = args.shapes.split(",")
    ops = args.ops.split(",")
    for op in ops:
        if op not in MEASURES:
            parser.error(f"--ops: unknown operator {op!r}; choose from {', '.join(MEASURES)}")
    for shape in shapes:
        if shape not in SHAPES:
            parser.error(f"--shapes: unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
    tokens = [int(t) for t in args.tokens.split(",")]
    if settings != [current_thp_setting()]:
        passed = []  # the arguments for the children: all but --thp, --csv and --plot
        skip = False
        for arg in argv:
            if skip:
                skip = False
            elif arg in ("--thp", "--csv", "--plot"):
                skip = True
            elif not arg.startswith(("--thp=", "--csv=", "--plot=")):
                passed.append(arg)
        rows = measure_in_children(passed, settings)
    else:
        gen = torch.Generator().manual_seed(0)
        rows = []
        total = len(shapes) * len(tokens) * len(ops)
        done = 0
        for shape in shapes:
            for n in tokens:
                for op in ops:
                    done += 1
                    print(f"[torch_compare {done}/{total}] {op} {shape} N={n} (THP {settings[0]})", file=sys.stderr,
                          flush=True)
                    for r in MEASURES[op](shape, n, dtype, args.runs, gen, no_scrub=args.no_scrub):
                        rows.append(dict(thp=settings[0], **r))
    for r in rows:
        r["ours_gbps"] = r["bytes"] / r["ours_s"] / 1e9
        r["torch_gbps"] = r["bytes"] / r["torch_s"] / 1e9
    print_table(rows, settings, args)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            writer.writeheader()
            writer.writerows(rows)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        titles = {"forward": "moe_init_routing", "backward": "moe_init_routing_grad",
                  "combine": "moe_finalize_routing", "combine_backward": "moe_finalize_routing_grad"}
        plotted = [op for op in titles if any(r["op"] == op for r in rows)]
        fig, axes = plt.subplots(1, len(plotted), figsize=(6 * len(plotted), 4.5), squeeze=False)
        for ax, op in zip(axes[0], plotted):
            for shape in shapes:
                sel = [r for r in rows if r["op"] == op and r["shape"] == shape and r["thp"] == settings[0]]
                line, = ax.plot([r["tokens"] for r in sel], [r["ours_gbps"] for r in sel], "o-", label=f"ours {shape}")
                ax.plot([r["tokens"] for r in sel], [r["torch_gbps"] for r in sel], "x--", color=line.get_color(),
                        label=f"torch {shape}")
            ax.set_xscale("log")
            ax.set_xlabel("tokens")
            ax.set_ylabel("GB/s (bytes that must move / time)")
            ax.set_title(f"{titles[op]} ({args.dtype}, {torch.get_num_threads()} threads)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
