"""PyTorch side of tools/gpu_check.sh (docs/cuda.md).

1. PyTorch eager baselines on the GPU at the same shapes as moe_routing_gpu_check, in GB/s over the
   same byte counts (the bytes the operation must move) and as a fraction of the copy bandwidth
   that moe_routing_gpu_check measured in the same run:
     backward: index_select + view + sum, and index_add_;
     forward:  stable argsort + index_select + bincount (+ the inverse permutation).
2. With --ext PATH (the _moe_routing_ops library built against this torch with CUDA): the torch
   operators on CUDA tensors against the same operators on CPU tensors, bit for bit (the combine's
   forward, grad and autograd backward too), and their times through torch.

Appends `RESULT|op|impl|case|dtype|ms|GB/s|%copy|verified` lines to --results.
"""

import argparse
import sys

import torch

# tools/cases/model_shapes.h's kModelShapes (moe_routing_gpu_check benchmarks each at N=8192): the
# same names, so that the script's table puts the rows of one case together.
MODELS = [("deepseek-v3", 7168, 256, 8), ("qwen3-235b", 4096, 128, 8), ("qwen3-30b", 2048, 128, 8),
          ("mixtral", 4096, 8, 2)]
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def median_ms(fn, runs=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def routing(n, k, e, generator):
    # top_k distinct experts per token, as a router gives.
    scores = torch.rand(n, e, device="cuda", generator=generator)
    return scores.topk(k, dim=1).indices.to(torch.int32)


def emit(out, op, impl, case, dtype, ms, nbytes, copy_gbps, verified="-"):
    gbps = nbytes / (ms * 1e-3) / 1e9
    line = f"RESULT|{op}|{impl}|{case}|{DTYPE_NAMES[dtype]}|{ms:.4f}|{gbps:.1f}|{100 * gbps / copy_gbps:.1f}|{verified}"
    print(f"BENCH {op:<22} {impl:<16} {case:<22} {DTYPE_NAMES[dtype]:<8} {ms:9.3f} ms {gbps:8.1f} GB/s "
          f"{100 * gbps / copy_gbps:6.1f}% of copy", flush=True)
    if out is not None:
        out.write(line + "\n")


def eager_baselines(out, copy_gbps, tokens=8192, dtype=torch.bfloat16):
    generator = torch.Generator(device="cuda").manual_seed(1)
    el = torch.finfo(dtype).bits // 8
    for name, h, e, k in MODELS:
        n, p = tokens, tokens * k
        case = f"{name} N={n}"
        x = torch.randn(n, h, device="cuda", dtype=dtype, generator=generator)
        ids = routing(n, k, e, generator)
        flat = ids.view(-1)
        positions = torch.arange(p, device="cuda")

        def forward():
            order = torch.argsort(flat, stable=True)
            expanded_x = x.index_select(0, order // k)
            counts = torch.bincount(flat, minlength=e)
            row_idx = torch.empty_like(order)
            row_idx[order] = positions
            return expanded_x, row_idx, counts

        fwd_bytes = n * h * el + p * 4 + p * h * el + p * 4 + e * 8
        emit(out, "moe_init_routing", "torch-argsort", case, dtype, median_ms(forward), fwd_bytes, copy_gbps)

        _, row_idx, _ = forward()
        order = torch.argsort(flat, stable=True)
        g = torch.randn(p, h, device="cuda", dtype=dtype, generator=generator)
        token_of_row = order // k

        def backward_select():
            return g.index_select(0, row_idx).view(n, k, h).sum(1)

        def backward_index_add():
            return torch.zeros(n, h, device="cuda", dtype=dtype).index_add_(0, token_of_row, g)

        bwd_bytes = p * h * el + p * 4 + n * h * el
        emit(out, "moe_init_routing_grad", "torch-select-sum", case, dtype, median_ms(backward_select), bwd_bytes,
             copy_gbps)
        emit(out, "moe_init_routing_grad", "torch-index_add", case, dtype, median_ms(backward_index_add), bwd_bytes,
             copy_gbps)
        del x, g


def extension_checks(out, path, copy_gbps):
    torch.ops.load_library(path)
    ops = torch.ops.moe_routing
    generator = torch.Generator(device="cpu").manual_seed(7)
    failures = 0
    # Bitwise: CUDA tensors vs CPU tensors through the same torch operators.
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for drop_pad in (0, 1):
            for order in ("tree", "sequential"):
                n, k, h, e = 300, 8, 1031, 16
                x = torch.randn(n, h, dtype=dtype, generator=generator)
                ids = torch.randint(0, e, (n, k), dtype=torch.int32, generator=generator)
                kwargs = dict(expert_num=e, drop_pad_mode=drop_pad, expert_capacity=200 if drop_pad else -1,
                              expert_tokens_num_flag=True, expert_tokens_num_type=1)
                cpu_out = ops.moe_init_routing(x, ids, **kwargs)
                gpu_out = ops.moe_init_routing(x.cuda(), ids.cuda(), **kwargs)
                same = all(torch.equal(a.view(torch.uint8) if a.is_floating_point() else a,
                                       b.cpu().view(torch.uint8) if b.is_floating_point() else b.cpu())
                           for a, b in zip(cpu_out, gpu_out))
                g = torch.randn(cpu_out[0].shape, dtype=dtype, generator=generator)
                cpu_grad = ops.moe_init_routing_grad(g, cpu_out[1], k, drop_pad, 0, order=order)
                gpu_grad = ops.moe_init_routing_grad(g.cuda(), gpu_out[1], k, drop_pad, 0, order=order)
                same = same and torch.equal(cpu_grad.view(torch.uint8), gpu_grad.cpu().view(torch.uint8))
                # The out= overloads on CUDA tensors write the same bits.
                names = ("expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum", "expanded_scale",
                         "expanded_topk_weight")
                outs = {name: torch.full_like(t, 7) for name, t in zip(names, gpu_out)}
                ops.moe_init_routing.out(x.cuda(), ids.cuda(), **kwargs, **outs)
                grad_out = torch.full_like(gpu_grad, 7)
                ops.moe_init_routing_grad.out(g.cuda(), gpu_out[1], k, drop_pad, 0, order=order, out=grad_out)
                same = same and all(torch.equal(a, b) for a, b in zip(gpu_out, outs.values()))
                same = same and torch.equal(grad_out.view(torch.uint8), gpu_grad.view(torch.uint8))
                tag = f"torch operators {DTYPE_NAMES[dtype]} drop_pad {drop_pad} {order}"
                print(("PASS " if same else "FAIL ") + tag + " (CUDA tensors vs CPU tensors and out=, bit for bit)")
                failures += not same
    failures += combine_checks(ops, generator, "cuda")
    # Errors keep their category: a bad index is an IndexError with the core's message.
    try:
        ops.moe_init_routing_grad(torch.ones(6, 2, device="cuda"),
                                  torch.tensor([0, 1, 2, 3, 4, 99], dtype=torch.int32, device="cuda"), 2, 0, 0)
        print("FAIL a bad index on CUDA raised nothing")
        failures += 1
    except IndexError as error:
        ok = "moe_init_routing_grad: expanded_row_idx[5] must be in [0, 6), got 99" in str(error)
        print(("PASS" if ok else "FAIL") + f" bad index on CUDA: IndexError: {str(error).splitlines()[0]}")
        failures += not ok
    # Times through torch (the current stream; allocation by torch's caching allocator).
    generator = torch.Generator(device="cuda").manual_seed(3)
    dtype = torch.bfloat16
    for name, h, e, k in MODELS:
        n, p = 8192, 8192 * k
        case = f"{name} N={n}"
        x = torch.randn(n, h, device="cuda", dtype=dtype, generator=generator)
        ids = routing(n, k, e, generator)
        fwd = lambda: ops.moe_init_routing(x, ids, expert_num=e, expert_tokens_num_flag=True, expert_tokens_num_type=1)
        emit(out, "moe_init_routing", "ours-torch-op", case, dtype, median_ms(fwd), n * h * 2 + p * 8 + p * h * 2 + e * 8,
             copy_gbps)
        row_idx = fwd()[1]
        g = torch.randn(p, h, device="cuda", dtype=dtype, generator=generator)
        bwd = lambda: ops.moe_init_routing_grad(g, row_idx, k, 0, 0)
        emit(out, "moe_init_routing_grad", "ours-torch-op", case, dtype, median_ms(bwd), p * h * 2 + p * 4 + n * h * 2,
             copy_gbps)
    return failures


def combine_checks(ops, generator, device):
    """moe_finalize_routing (every drop_pad_mode, both numerics, bias / x1 / x2 / scales) and its
    grad through the torch operators on `device` tensors against CPU tensors, bit for bit: the
    forward, the out= overloads, the grad, and the autograd backward."""
    failures = 0
    n, k, h, e = 300, 8, 1031, 16
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        scales_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
        for mode in (0, 1, 2, 3):
            for numerics in ("atlas_a2", "ascend_950"):
                rows = e * 200 if mode in (1, 3) else n * k - 100  # dropless: 100 pairs cut
                index = torch.randperm(max(rows, n * k), generator=generator)[:n * k]
                index = torch.where(index < (rows if mode in (1, 3) else n * k), index, -1).to(torch.int32)
                cpu = dict(expanded_x=torch.randn(rows, h, generator=generator).to(dtype),
                           x1=torch.randn(n, h, generator=generator).to(dtype),
                           x2=torch.randn(n, h, generator=generator).to(dtype),
                           bias=torch.randn(e, h, generator=generator).to(dtype),
                           scales=torch.rand(n, k, generator=generator).to(scales_dtype),
                           expert_idx=torch.randint(0, e, (n, k), dtype=torch.int32, generator=generator))
                if mode in (1, 3):
                    cpu["expanded_x"] = cpu["expanded_x"].view(e, 200, h)
                dev = {name: t.to(device) for name, t in cpu.items()}
                kwargs = dict(drop_pad_mode=mode, numerics=numerics)
                results = []
                for inputs, idx in ((cpu, index), (dev, index.to(device))):
                    leaves = {name: t.clone().requires_grad_(t.is_floating_point()) for name, t in inputs.items()}
                    out = ops.moe_finalize_routing(leaves["expanded_x"], idx, leaves["x1"], leaves["x2"],
                                                   leaves["bias"], leaves["scales"], leaves["expert_idx"], **kwargs)
                    grad_y = torch.randn(n, h, generator=torch.Generator().manual_seed(mode)).to(dtype).to(device)
                    out.backward(grad_y)
                    written = torch.full_like(out, 7)
                    ops.moe_finalize_routing.out(inputs["expanded_x"], idx, inputs["x1"], inputs["x2"],
                                                 inputs["bias"], inputs["scales"], inputs["expert_idx"],
                                                 **kwargs, out=written)
                    row_index = idx if mode >= 2 else idx.view(k, n).t().reshape(-1).contiguous()
                    grad_mode = 1 if mode in (1, 3) else 0
                    grads = ops.moe_finalize_routing_grad(
                        grad_y, row_index, inputs["expanded_x"], inputs["scales"], inputs["expert_idx"],
                        inputs["bias"], grad_mode, 0 if grad_mode else rows, e if grad_mode else 0,
                        200 if grad_mode else 0, numerics=numerics, compute_grad_bias=True)
                    results.append([out.detach(), written] + list(grads) +
                                   [leaves[name].grad for name in ("expanded_x", "x1", "x2", "bias", "scales")])
                same = all(torch.equal(a.contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8))
                           for a, b in zip(*results))
                tag = f"torch combine {DTYPE_NAMES[dtype]} drop_pad_mode {mode} {numerics}"
                print(("PASS " if same else "FAIL ") + tag + f" ({device} tensors vs CPU tensors: forward, out=, "
                      "grad, autograd, bit for bit)")
                failures += not same
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--copy-gbps", type=float, required=True, help="copy bandwidth measured by gpu_check")
    parser.add_argument("--results", help="file to append RESULT lines to")
    parser.add_argument("--ext", help="path of _moe_routing_ops built with CUDA: check and time the operators")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check.py: torch sees no CUDA device; skipping the PyTorch comparison")
        return 0
    out = open(args.results, "a") if args.results else None
    print(f"gpu_check.py: torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name()}")
    failures = 0
    try:
        if args.ext:
            failures = extension_checks(out, args.ext, args.copy_gbps)
        else:
            eager_baselines(out, args.copy_gbps)
    finally:
        if out is not None:
            out.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
