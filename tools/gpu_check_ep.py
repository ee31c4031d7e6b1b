"""Expert parallelism on CUDA tensors with NCCL (tools/gpu_check.sh, docs/distributed.md): a world of
one NCCL rank runs dispatch -> experts -> combine, forward and backward, on CUDA tensors, compared
bit for bit with the single-device operators on CPU tensors (the CUDA backend's contract: the CPU's
bits) for fp32 / fp16 / bf16, dropless and capacity, both numerics.

    PYTHONPATH=<package with the CUDA-built library> python3 tools/gpu_check_ep.py
    python3 tools/gpu_check_ep.py --backend gloo --device cpu      # the same path on the CPU
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist

from moe_routing._port import dtype_name

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import ep_cases  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda"):
        torch.cuda.set_device(0)
    dist.init_process_group(args.backend, store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=120))
    specs = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for capacity in (None, 3):
            name = f"{dtype_name(dtype)}_{'capacity' if capacity else 'dropless'}"
            specs.append(ep_cases.case(name, [37], dtype=dtype, capacity=capacity, hidden=200, top_k=3, experts=8))
    specs.append(ep_cases.case("float16_ascend_950", [37], dtype=torch.float16, numerics="ascend_950", hidden=200,
                               top_k=3, experts=8, x2=True))
    specs.append(ep_cases.case("bfloat16_float32_scales", [37], dtype=torch.bfloat16, scales="float32",
                               capacity=5, hidden=200, top_k=3, experts=8))
    failures = 0
    for spec in specs:
        result = ep_cases.compare(spec, 0, 1, device=args.device)
        failures += result != "ok"
        print(f"{'PASS' if result == 'ok' else 'FAIL'} ep world 1 {args.backend} {spec['name']}: {result}")
    print(f"expert parallelism ({args.backend}, {args.device} tensors): {len(specs) - failures} of {len(specs)} "
          f"scenarios bit for bit equal to the single-device operators on the CPU")
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
