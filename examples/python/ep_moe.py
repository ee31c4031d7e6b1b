"""Expert-parallel training of an MoE layer (moe_routing.distributed.ExpertParallelMoE), checked
bit for bit against the same layer trained in one process on the global batch.

    python examples/python/ep_moe.py [--world 2] [--steps 6] [--capacity C]     # spawns the ranks (gloo)
    torchrun --nproc-per-node N examples/python/ep_moe.py [--backend nccl]     # the ranks torchrun starts

The layer: router (softmax top-k, on the replicated global batch: the deterministic path) ->
dispatch (each pair's row to the rank owning its expert) -> every rank's experts relu(x @ w1) @ w2,
one expert at a time -> combine (rows back to their token's rank, weighted and summed with the
per-expert bias by moe_finalize_routing). The loss is the global batch's MSE, computed on the
replicated output. Rank r of W owns experts [r*E/W, (r+1)*E/W) and trains its own tokens (the
ranks hold different numbers of tokens).

Spawned (no torchrun), this process also trains the layer alone, without torch.distributed, and
compares every step's loss, every rank's output rows and every gradient with the ranks'. Under
torchrun each rank trains the layer alone too (in a process group of one) and compares its part.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

import moe_routing.distributed as ep

_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaN-safe)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    view = _INT_VIEW.get(a.dtype)
    return torch.equal(a.view(view), b.view(view)) if view is not None else torch.equal(a, b)


def config(tokens: List[int], *, hidden=32, ffn=64, experts=8, top_k=2, capacity=None, dtype=torch.float32,
           numerics="atlas_a2", seed=0, steps=6, lr=0.5) -> dict:
    """A training run: tokens[r] on rank r (the global batch is their concatenation)."""
    return dict(tokens=list(tokens), hidden=hidden, ffn=ffn, experts=experts, top_k=top_k, capacity=capacity,
                dtype=dtype, numerics=numerics, seed=seed, steps=steps, lr=lr)


def train(cfg: dict, group=None, device: str = "cpu") -> dict:
    """SGD on the layer, this rank holding its share of the global batch (a world of one holds
    all of it). Returns per step: the loss (global), this rank's output rows, every gradient."""
    alone = group is None and not dist.is_initialized()
    world = 1 if alone else dist.get_world_size(group)
    rank = 0 if alone else dist.get_rank(group)
    tokens = cfg["tokens"] if world > 1 else [sum(cfg["tokens"])]
    lo, hi = sum(tokens[:rank]), sum(tokens[:rank + 1])
    model = ep.ExpertParallelMoE(cfg["hidden"], cfg["ffn"], cfg["experts"], cfg["top_k"], group=group,
                                 expert_capacity=cfg["capacity"], dtype=cfg["dtype"], numerics=cfg["numerics"],
                                 seed=cfg["seed"]).to(device)
    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    n = sum(cfg["tokens"])
    inputs = torch.randn(n, cfg["hidden"], generator=g).to(cfg["dtype"]).to(device)
    target = torch.randn(n, cfg["hidden"], generator=g).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    record: dict = {"loss": [], "y": [], "grads": []}
    for _ in range(cfg["steps"]):
        opt.zero_grad()
        y = model(inputs[lo:hi])
        # The global batch's loss, on every rank: the output replicated, the same expression.
        y_all, _ = ep.replicate_rows(y, group=group)
        loss = torch.nn.functional.mse_loss(y_all.float(), target)
        loss.backward()
        record["loss"].append(loss.detach().cpu())
        record["y"].append(y.detach().cpu())
        record["grads"].append({name: p.grad.detach().cpu() for name, p in model.named_parameters()})
        opt.step()
    return record


def differences(cfg: dict, got: dict, alone: dict, rank: int, world: int) -> List[str]:
    """What of rank `rank`'s run differs from the single-process run (its rows and its experts)."""
    tokens = cfg["tokens"]
    lo, hi = sum(tokens[:rank]), sum(tokens[:rank + 1])
    local = cfg["experts"] // world
    mine = slice(rank * local, (rank + 1) * local)
    found = []
    for step in range(len(got["loss"])):
        if not bitwise_equal(got["loss"][step], alone["loss"][step]):
            found.append(f"rank {rank}: loss at step {step}")
        if not bitwise_equal(got["y"][step], alone["y"][step][lo:hi]):
            found.append(f"rank {rank}: output at step {step}")
        for name, grad in got["grads"][step].items():
            want = alone["grads"][step][name]
            if not bitwise_equal(grad, want[mine] if name in ("w1", "w2") else want):
                found.append(f"rank {rank}: gradient of {name} at step {step}")
    return found


def _spawned_rank(rank: int, world: int, cfg: dict) -> dict:
    return train(cfg)


def _report(cfg: dict, losses_ep: List[torch.Tensor], losses_alone: List[torch.Tensor], found: List[str],
            world: int, how: str) -> int:
    print(f"step  loss ({world} ranks)   loss (one process)")
    for step, (a, b) in enumerate(zip(losses_ep, losses_alone)):
        print(f"{step:4d}  {a.item():16.9f}  {b.item():18.9f}")
    names = "router.weight, w1, w2, bias"
    if not found:
        print(f"expert parallelism on {world} ranks ({how}): the losses, every rank's outputs and the gradients of "
              f"{names} equal the single-process run bit for bit at every one of the {cfg['steps']} steps")
        return 0
    print(f"DIFFER from the single-process run: {'; '.join(found[:10])}")
    return 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    parser.add_argument("--tokens", type=str, default=None,
                        help="tokens per rank, comma-separated (default 48 on even ranks, 32 on odd ones)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--capacity", type=int, default=None, help="expert capacity (default: dropless)")
    parser.add_argument("--backend", default="gloo", help="under torchrun: gloo (CPU) or nccl (one GPU per rank)")
    args = parser.parse_args(argv)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if torchrun else args.world
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else [48 if r % 2 == 0 else 32
                                                                           for r in range(world)]
    if len(tokens) != world:
        parser.error(f"--tokens must list {world} counts (one per rank), got {len(tokens)}")
    cfg = config(tokens, experts=args.experts, capacity=args.capacity, steps=args.steps)
    torch.set_num_threads(1)  # every process computes with the same thread count
    if not torchrun:
        print(f"== ExpertParallelMoE (E={cfg['experts']}, K={cfg['top_k']}, H={cfg['hidden']}, "
              f"capacity={cfg['capacity']}) on {world} spawned ranks (gloo, 127.0.0.1), tokens per rank "
              f"{tokens}, vs one process on the global batch of {sum(tokens)}")
        ranks = ep.run_local(_spawned_rank, world, cfg, timeout=300)
        alone = train(cfg)
        found = [d for rank, got in enumerate(ranks) for d in differences(cfg, got, alone, rank, world)]
        return _report(cfg, ranks[0]["loss"], alone["loss"], found, world, "gloo, spawned")
    # torchrun: this process is one rank; the single-process layer runs here in a group of one.
    device = "cpu"
    if args.backend == "nccl":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    alone_group = [dist.new_group([r]) for r in range(world)][rank]
    got = train(cfg, device=device)
    alone = train(cfg, group=alone_group, device=device)
    found = differences(cfg, got, alone, rank, world)
    everyone: List[List[str]] = [[] for _ in range(world)]
    dist.all_gather_object(everyone, found)
    status = 0
    if rank == 0:
        status = _report(cfg, got["loss"], alone["loss"], [d for part in everyone for d in part], world,
                         f"torchrun, {args.backend}")
    dist.destroy_process_group()
    return status if rank == 0 else (1 if found else 0)


if __name__ == "__main__":
    sys.exit(main())
