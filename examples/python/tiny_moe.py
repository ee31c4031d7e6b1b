"""A tiny MoE layer trained on synthetic data, twice: once dispatching and combining tokens with
moe_routing's operators, once with plain PyTorch indexing. Prints the loss per step and checks
that losses and gradients agree.

    python examples/python/tiny_moe.py [--steps 8] [--tokens 64] [--compile]
"""
from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import moe_routing


class TinyMoE(nn.Module):
    """Router (top-k of softmax) + experts (two small linear maps with a ReLU) + weighted combine."""

    def __init__(self, hidden=16, experts=4, top_k=2, ffn=32, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.top_k = top_k
        self.experts = experts
        self.router = nn.Parameter(torch.randn(hidden, experts, generator=g) * 0.5)
        self.w1 = nn.Parameter(torch.randn(experts, hidden, ffn, generator=g) / hidden ** 0.5)
        self.w2 = nn.Parameter(torch.randn(experts, ffn, hidden, generator=g) / ffn ** 0.5)

    def route(self, x):
        probs = torch.softmax(x @ self.router, dim=-1)
        topk_weight, topk_idx = probs.topk(self.top_k, dim=-1)
        return topk_weight, topk_idx.to(torch.int32)

    def experts_on_rows(self, rows, row_expert):
        """Each expanded row through its expert's two linear maps."""
        h = torch.relu(torch.bmm(rows.unsqueeze(1), self.w1[row_expert]))
        return torch.bmm(h, self.w2[row_expert]).squeeze(1)

    def forward_ours(self, x):
        n = x.shape[0]
        topk_weight, topk_idx = self.route(x)
        expanded_x, expanded_row_idx, counts, _, expanded_topk_weight = moe_routing.moe_init_routing(
            x, topk_idx, topk_weight=topk_weight, expert_num=self.experts, expert_tokens_num_type=1,
            expert_tokens_num_flag=True)
        # Rows are sorted by expert: expert e owns counts[e] consecutive rows.
        row_expert = torch.repeat_interleave(torch.arange(self.experts), counts, output_size=n * self.top_k)
        y = self.experts_on_rows(expanded_x, row_expert) * expanded_topk_weight
        # The combine (unpermute) is the backward operator's sum: out[i] = sum_t y[row(i, t)].
        return moe_routing.moe_init_routing_grad(y, expanded_row_idx, self.top_k)

    def forward_plain(self, x):
        n, hidden = x.shape
        topk_weight, topk_idx = self.route(x)
        flat_expert = topk_idx.reshape(-1).long()
        order = torch.argsort(flat_expert, stable=True)
        rows = x[order // self.top_k]
        y = self.experts_on_rows(rows, flat_expert[order]) * topk_weight.reshape(-1)[order, None]
        out = torch.zeros(n, hidden)
        return out.index_add(0, order // self.top_k, y)


def train(use_ours: bool, steps: int, tokens: int, compile_model: bool = False, seed: int = 0):
    # PyTorch's own CPU kernels are not all deterministic by default: the backward of the
    # experts' weight gather (w1[row_expert], an index_put_ with accumulate, in both layers) adds
    # rows of the same expert from several threads in an order that depends on thread timing
    # (seen: the two layers' w1 gradients 1 ulp apart in ~1 of 5 processes). Our operators are
    # deterministic either way; PyTorch's deterministic mode makes the rest of the layer so too,
    # so that the two layers can be compared bit for bit.
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return _train(use_ours, steps, tokens, compile_model, seed)
    finally:
        torch.use_deterministic_algorithms(previous)


def _train(use_ours: bool, steps: int, tokens: int, compile_model: bool, seed: int):
    torch.manual_seed(seed)
    model = TinyMoE(seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, 16, generator=g)
    target = torch.randn(tokens, 16, generator=g)
    forward = model.forward_ours if use_ours else model.forward_plain
    if compile_model:
        forward = torch.compile(forward, fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(x), target)
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return losses, grads


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) our layer")
    args = parser.parse_args(argv)
    ours_losses, ours_grads = train(True, args.steps, args.tokens, args.compile)
    plain_losses, plain_grads = train(False, args.steps, args.tokens)
    print("step  loss (moe_routing)  loss (plain PyTorch)")
    for step, (a, b) in enumerate(zip(ours_losses, plain_losses)):
        print(f"{step:4d}  {a:18.8f}  {b:20.8f}")
    worst = max((a - b).abs().max().item() for ga, gb in zip(ours_grads, plain_grads) for a, b in zip(ga, gb))
    identical = ours_losses == plain_losses and all(
        torch.equal(a, b) for ga, gb in zip(ours_grads, plain_grads) for a, b in zip(ga, gb))
    ok = identical or (worst <= 1e-5 and all(abs(a - b) <= 1e-6 * max(1.0, abs(b))
                                             for a, b in zip(ours_losses, plain_losses)))
    verdict = "identical bit for bit" if identical else ("agree to rounding" if ok else "DIFFER")
    print(f"losses and gradients vs the plain-PyTorch layer: largest difference {worst:.3g} -> {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
