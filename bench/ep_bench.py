"""Expert-parallel dispatch + combine (moe_routing.distributed) on W local ranks (gloo, 127.0.0.1),
forward and backward, against a plain-PyTorch EP layer doing the same exchange and against the
bare all_to_all_single of the same bytes (what the transport allows).

    .venv/bin/python bench/ep_bench.py                                   # DeepSeek-V3 shapes, world 2
    .venv/bin/python bench/ep_bench.py --tokens 64,256,1024 --runs 15 --markdown
    .venv/bin/python bench/ep_bench.py --hidden 64 --experts 8 --tokens 8,32 --runs 2   # a quick check

One step, timed on every rank from a barrier to the end of the backward (the step's time is the
slowest rank's), each rank holding `tokens` tokens of hidden size H routed to K of E experts
(uniformly at random), the experts the identity (their time is not the exchange's):
  ours      recv_x, _, h = ep.dispatch(x, expert_idx, E); y = ep.combine(recv_x, h, scales=w);
            y.backward(grad_y)  (scales float32 with bfloat16 rows; the counts exchange included)
  baseline  plain PyTorch: argsort + index_select of the token rows, counts by all_to_all_single,
            rows by all_to_all_single in an autograd function (ep.all_to_all's, without its
            agreement), the receiver's reorder to expert-major by index_select, the way back, and
            the combine as index_add_ of the weighted rows into a float32 buffer; backward by autograd
  bare      four all_to_all_single of the layer's rows, one per (token, expert) pair (dispatch,
            combine, and their backwards), into preallocated buffers: the transport's limit for
            this exchange. Ours sends fewer rows than that (a token once per owning rank in the
            dispatch forward and the combine backward): the table shows both counts
Runs interleave the three (each run: one step of each, in turn); reported are medians over runs of
the step time and of the within-run ratios. Before timing, the baseline's output is checked
against ours (to rounding: it sums in another order) and ours against the single-device
operators on the global batch (bit for bit), so both compute the same layer.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List

import torch
import torch.distributed as dist

import moe_routing
import moe_routing.distributed as ep
from moe_routing.distributed._comm import Comm, _AllToAll

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def make_inputs(rank: int, tokens: int, hidden: int, experts: int, top_k: int, dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    idx = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).to(torch.int32) \
        if tokens else torch.empty(0, top_k, dtype=torch.int32)
    scales_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
    scales = torch.rand(tokens, top_k, generator=g).to(scales_dtype)
    grad_y = torch.randn(tokens, hidden, generator=g).to(dtype)
    return x, idx, scales, grad_y


def ours_step(x, idx, scales, grad_y, experts):
    x = x.detach().requires_grad_()
    recv_x, _, handle = ep.dispatch(x, idx, experts)
    y = ep.combine(recv_x, handle, scales=scales)
    y.backward(grad_y)
    return y.detach(), x.grad, handle


def rows_moved(handle) -> int:
    """Rows this rank sends in a step of ours: tokens once per owning rank (dispatch forward,
    combine backward), kept pairs (combine forward, dispatch backward)."""
    return 2 * sum(handle.token_send_splits) + 2 * sum(handle.send_splits)


def exchange_counts(flat_idx, experts):
    """(counts_in, send_splits, recv_splits): every source rank's pair counts for my experts
    ([W * E/W], by all_to_all_single of the per-expert counts), and the pair rows this rank sends
    to / receives from each rank."""
    world = dist.get_world_size()
    local = experts // world
    counts = torch.bincount(flat_idx, minlength=experts)
    counts_in = torch.empty_like(counts)
    dist.all_to_all_single(counts_in, counts)
    return counts_in, counts.view(world, local).sum(1).tolist(), counts_in.view(world, local).sum(1).tolist()


def plain_all_to_all(rows, output_splits, input_splits):
    """ep.all_to_all without its agreement exchange: the baseline's rows move as all_to_all_single."""
    return _AllToAll.apply(rows, output_splits, input_splits, Comm(None, "all_to_all"))


def baseline_step(x, idx, scales, grad_y, experts):
    world = dist.get_world_size()
    local = experts // world
    x = x.detach().requires_grad_()
    n, k = idx.shape
    flat = idx.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    token = torch.div(order, k, rounding_mode="floor")
    rows = x.index_select(0, token)
    counts_in, send_splits, recv_splits = exchange_counts(flat, experts)
    received = sum(recv_splits)
    recv = plain_all_to_all(rows, recv_splits, send_splits)
    # Source-major blocks (s, j) -> expert-major (j, s).
    block = torch.repeat_interleave(torch.arange(world * local), counts_in, output_size=received)
    to_expert_major = torch.argsort((block % local) * world + torch.div(block, local, rounding_mode="floor"),
                                    stable=True)
    expert_rows = recv.index_select(0, to_expert_major)
    expert_out = expert_rows  # the identity experts
    back = expert_out.index_select(0, torch.argsort(to_expert_major))
    returned = plain_all_to_all(back, send_splits, recv_splits)
    weighted = returned.float() * scales.reshape(-1)[order].float().unsqueeze(1)
    y = torch.zeros(n, x.shape[1], dtype=torch.float32).index_add(0, token, weighted).to(x.dtype)
    y.backward(grad_y)
    return y.detach(), x.grad


class Bare:
    """The four row exchanges of a step, as bare all_to_all_single calls on preallocated buffers."""

    def __init__(self, x, idx, experts):
        _, self.send, self.recv = exchange_counts(idx.reshape(-1).long(), experts)
        hidden = x.shape[1]
        self.rows = torch.randn(sum(self.send), hidden).to(x.dtype)
        self.received = torch.empty(sum(self.recv), hidden, dtype=x.dtype)
        self.back = torch.empty_like(self.rows)

    def step(self):
        for _ in range(2):  # forward (dispatch, combine), then backward (combine's, dispatch's)
            dist.all_to_all_single(self.received, self.rows, self.recv, self.send)
            dist.all_to_all_single(self.back, self.received, self.send, self.recv)


def timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rank_main(rank: int, world: int, args: dict) -> Dict[int, dict]:
    dtype = DTYPES[args["dtype"]]
    results = {}
    for tokens in args["tokens"]:
        x, idx, scales, grad_y = make_inputs(rank, tokens, args["hidden"], args["experts"], args["top_k"], dtype)
        # Same layer: ours bit for bit against the single-device operators on the global batch;
        # the baseline to rounding.
        y_ours, gx_ours, handle = ours_step(x, idx, scales, grad_y, args["experts"])
        y_base, gx_base = baseline_step(x, idx, scales, grad_y, args["experts"])
        if not (torch.allclose(y_ours.float(), y_base.float(), rtol=2e-2, atol=2e-2)
                and torch.allclose(gx_ours.float(), gx_base.float(), rtol=2e-2, atol=2e-2)):
            raise AssertionError(f"rank {rank}, {tokens} tokens: the baseline does not compute our layer")
        everyone = [make_inputs(r, tokens, args["hidden"], args["experts"], args["top_k"], dtype)
                    for r in range(world)] if args["check"] else None
        if everyone is not None:
            gx = torch.cat([e[0] for e in everyone]).requires_grad_()
            expanded, row_idx, *_ = moe_routing.moe_init_routing(gx, torch.cat([e[1] for e in everyone]),
                                                                  expert_num=args["experts"])
            y = moe_routing.moe_finalize_routing(expanded, row_idx, scales=torch.cat([e[2] for e in everyone]),
                                                 drop_pad_mode=2)
            y.backward(torch.cat([e[3] for e in everyone]))
            lo = tokens * rank
            if not (torch.equal(y.detach()[lo:lo + tokens], y_ours) and torch.equal(gx.grad[lo:lo + tokens], gx_ours)):
                raise AssertionError(f"rank {rank}, {tokens} tokens: ours differs from the single-device operators")
        bare = Bare(x, idx, args["experts"])
        contenders = {"ours": lambda: ours_step(x, idx, scales, grad_y, args["experts"]),
                      "baseline": lambda: baseline_step(x, idx, scales, grad_y, args["experts"]),
                      "bare": bare.step}
        for _ in range(args["warmup"]):
            for fn in contenders.values():
                fn()
        times: Dict[str, List[float]] = {name: [] for name in contenders}
        for _ in range(args["runs"]):
            for name, fn in contenders.items():
                times[name].append(timed(fn))
        results[tokens] = {"times": times, "rows": int(idx.numel()), "bytes": int(idx.numel()) * args["hidden"]
                           * x.element_size(), "moved": rows_moved(handle)}
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--tokens", default="64,256,1024", help="tokens per rank, comma-separated")
    parser.add_argument("--hidden", type=int, default=7168, help="H (DeepSeek-V3: 7168)")
    parser.add_argument("--experts", type=int, default=256, help="E (DeepSeek-V3: 256)")
    parser.add_argument("--top-k", type=int, default=8, help="K (DeepSeek-V3: 8)")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip the bit-for-bit check against the single-device operators")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--thp", action="store_true",
                        help="THP_MEM_ALLOC_ENABLE=1 in the ranks: large fresh CPU tensors on huge pages (fewer "
                             "page faults for ours' and the baseline's outputs)")
    args = parser.parse_args(argv)
    if args.thp:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"  # read by each rank's PyTorch at start
    config = dict(tokens=[int(t) for t in args.tokens.split(",")], hidden=args.hidden, experts=args.experts,
                  top_k=args.top_k, dtype=args.dtype, runs=args.runs, warmup=args.warmup, check=args.check)
    per_rank = ep.run_local(rank_main, args.world, config, timeout=3600, collective_timeout=600,
                            threads=args.threads)
    header = ["tokens/rank", "rows/rank", "MiB/exchange", "rows sent/step ours (bare)", "bare ms", "ours ms",
              "baseline ms", "ours / bare", "baseline / ours"]
    lines = []
    for tokens in config["tokens"]:
        runs = range(args.runs)
        # A run's time is its slowest rank's; ratios are taken within a run, then the median.
        step = {name: [max(r[tokens]["times"][name][i] for r in per_rank) for i in runs]
                for name in ("bare", "ours", "baseline")}
        ours_vs_bare = statistics.median(step["ours"][i] / step["bare"][i] for i in runs)
        base_vs_ours = statistics.median(step["baseline"][i] / step["ours"][i] for i in runs)
        first = per_rank[0][tokens]
        lines.append([str(tokens), str(first["rows"]), f"{first['bytes'] / 2**20:.1f}",
                      f"{first['moved']} ({4 * first['rows']})",
                      f"{statistics.median(step['bare']) * 1e3:.2f}", f"{statistics.median(step['ours']) * 1e3:.2f}",
                      f"{statistics.median(step['baseline']) * 1e3:.2f}", f"{ours_vs_bare:.2f}x",
                      f"{base_vs_ours:.2f}x"])
    print(f"world {args.world} (gloo, 127.0.0.1, {args.threads} thread(s) per rank{', THP' if args.thp else ''}), "
          f"H={args.hidden}, "
          f"E={args.experts}, K={args.top_k}, {args.dtype}; one step = dispatch + combine forward and backward; "
          f"median of {args.runs} runs")
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
        print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
        for line in lines:
            print("  ".join(v.rjust(w) for v, w in zip(line, widths)))
    print("targets: ours / bare <= 1.3x, baseline / ours > 1x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
