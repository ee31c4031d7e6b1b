"""A whole MoE layer on moe_routing's operators, trained on synthetic data next to the same layer
written in plain PyTorch, and checked bit for bit: every step's output, loss and gradient.

    python examples/python/tiny_moe.py [--steps 8] [--tokens 64] [--compile]

(--compile: our layer under torch.compile(fullgraph=True) with inductor, which regenerates
PyTorch's own float operations around our operators; the layers then agree to rounding.)

The layer (DeepSeek-style: a shared expert beside top-k routed experts):

    x        = inputs @ embed
    weights  = top-k of softmax(x @ router)                      (scales [N, K], expert ids [N, K])
    dispatch : moe_init_routing(x, ids)                          -> one row per (token, choice)
    experts  : relu(row @ w1[e]) @ w2[e]                         (each row through its expert e)
    combine  : moe_finalize_routing(rows, expanded_row_idx, x1=x @ shared, bias=b2, scales=weights,
                                    expert_idx=ids, drop_pad_mode=2)
               out[i] = x1[i] + sum_t weights[i, t] * (row(i, t) + b2[ids[i, t]])

The plain layer computes the same with torch indexing and, for the combine, with a
torch.autograd.Function whose forward and backward are written out in the order
docs/moe_finalize_routing.md documents (float32, atlas_a2): PyTorch's own reductions (the sum over
H behind a broadcast weight's gradient, index_add's accumulation) follow no documented order, so
autograd alone could not be compared bit for bit. Every parameter - embed, router, w1, w2, b2,
shared - gets its gradient through our operators' backwards in one layer and through the plain
statement in the other.
"""
from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import moe_routing


class TinyMoE(nn.Module):
    def __init__(self, hidden=16, experts=4, top_k=2, ffn=32, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.top_k = top_k
        self.experts = experts
        self.embed = nn.Parameter(torch.randn(hidden, hidden, generator=g) / hidden ** 0.5)
        self.router = nn.Parameter(torch.randn(hidden, experts, generator=g) * 0.5)
        self.w1 = nn.Parameter(torch.randn(experts, hidden, ffn, generator=g) / hidden ** 0.5)
        self.w2 = nn.Parameter(torch.randn(experts, ffn, hidden, generator=g) / ffn ** 0.5)
        self.b2 = nn.Parameter(torch.randn(experts, hidden, generator=g) * 0.1)
        self.shared = nn.Parameter(torch.randn(hidden, hidden, generator=g) / hidden ** 0.5)

    def route(self, x):
        probs = torch.softmax(x @ self.router, dim=-1)
        topk_weight, topk_idx = probs.topk(self.top_k, dim=-1)
        return topk_weight, topk_idx.to(torch.int32)

    def experts_on_rows(self, rows, row_expert):
        """Each expanded row through its expert's two linear maps (the bias b2 comes in the combine)."""
        h = torch.relu(torch.bmm(rows.unsqueeze(1), self.w1[row_expert]))
        return torch.bmm(h, self.w2[row_expert]).squeeze(1)

    def forward_ours(self, inputs):
        n = inputs.shape[0]
        x = inputs @ self.embed
        topk_weight, topk_idx = self.route(x)
        expanded_x, expanded_row_idx, counts, _, _ = moe_routing.moe_init_routing(
            x, topk_idx, expert_num=self.experts, expert_tokens_num_type=1, expert_tokens_num_flag=True)
        # Rows are sorted by expert: expert e owns counts[e] consecutive rows.
        row_expert = torch.repeat_interleave(torch.arange(self.experts), counts, output_size=n * self.top_k)
        expanded_y = self.experts_on_rows(expanded_x, row_expert)
        return moe_routing.moe_finalize_routing(expanded_y, expanded_row_idx, x1=x @ self.shared, bias=self.b2,
                                                scales=topk_weight, expert_idx=topk_idx, drop_pad_mode=2)

    def forward_plain(self, inputs):
        x = inputs @ self.embed
        topk_weight, topk_idx = self.route(x)
        flat_expert = topk_idx.reshape(-1).long()
        order = torch.argsort(flat_expert, stable=True)  # row d holds pair order[d]
        row_of_pair = torch.empty_like(order)
        row_of_pair[order] = torch.arange(order.numel())
        expanded_y = self.experts_on_rows(x[order // self.top_k], flat_expert[order])
        return PlainCombine.apply(expanded_y, row_of_pair, x @ self.shared, self.b2, topk_weight, flat_expert)


def padded_tree(values, lanes):
    """Adjacent-pair binary tree over the last dimension padded with +0 to `lanes` lanes."""
    level = torch.zeros(values.shape[:-1] + (lanes,), dtype=values.dtype)
    level[..., :values.shape[-1]] = values
    while level.shape[-1] > 1:
        level = level[..., 0::2] + level[..., 1::2]
    return level[..., 0]


class PlainCombine(torch.autograd.Function):
    """out[i] = x1[i] + sum_t scales[i, t] * (rows[row_of_pair[i*K + t]] + bias[expert[i*K + t]]),
    float32, every pair present, in docs/moe_finalize_routing.md's order and with its gradients."""

    @staticmethod
    def forward(ctx, rows, row_of_pair, x1, bias, scales, expert):
        n, k = scales.shape
        terms = rows[row_of_pair].view(n, k, -1) + bias[expert].view(n, k, -1)
        acc = x1 + 0.0  # atlas_a2: x1 + 0 without x2
        for t in range(k):  # terms added one at a time in increasing t
            acc = acc + terms[:, t] * scales[:, t, None]
        ctx.save_for_backward(row_of_pair, scales, expert, terms)
        ctx.num_experts = bias.shape[0]
        return acc

    @staticmethod
    def backward(ctx, grad):
        row_of_pair, scales, expert, terms = ctx.saved_tensors
        n, k = scales.shape
        hidden = grad.shape[1]
        # A row's gradient: grad_y[i] * scale (one float32 product; one pair per row).
        per_pair = (grad[:, None, :] * scales[:, :, None]).view(n * k, hidden)
        grad_rows = torch.empty_like(per_pair)
        grad_rows[row_of_pair] = per_pair
        # A scale's gradient: the products (row + bias) * grad_y summed in atlas_a2's order - here
        # H <= 512, one chunk of one 512-lane adjacent-pair tree, added to +0 twice (group sum
        # into the chunk sum, chunk sum into the total).
        assert hidden <= 512, "this plain statement covers one 512-lane group"
        grad_scales = 0.0 + (0.0 + padded_tree(terms * grad[:, None, :], 512))
        # bias's gradient: per expert, its pairs' products in increasing pair index, the first
        # assigned, then added one at a time (+0 for an expert without pairs).
        grad_bias = torch.zeros(ctx.num_experts, hidden)
        seen = torch.zeros(ctx.num_experts, dtype=torch.bool)
        order = torch.argsort(expert, stable=True)
        counts = torch.bincount(expert, minlength=ctx.num_experts)
        starts = torch.cumsum(counts, 0) - counts
        for rank in range(int(counts.max()) if counts.numel() else 0):
            has = counts > rank
            term = per_pair[order[(starts + rank).clamp(max=n * k - 1)]]
            grad_bias = torch.where(has[:, None], torch.where(seen[:, None], grad_bias + term, term), grad_bias)
            seen |= has
        return grad_rows, None, grad, grad_bias, grad_scales, None


def train(use_ours: bool, steps: int, tokens: int, compile_model: bool = False, seed: int = 0):
    """(outputs, losses, gradients) of each step of SGD on the layer."""
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
    inputs = torch.randn(tokens, 16, generator=g)
    target = torch.randn(tokens, 16, generator=g)
    forward = model.forward_ours if use_ours else model.forward_plain
    if compile_model:
        forward = torch.compile(forward, fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outputs, losses, grads = [], [], []
    for _ in range(steps):
        opt.zero_grad()
        out = forward(inputs)
        loss = torch.nn.functional.mse_loss(out, target)
        loss.backward()
        outputs.append(out.detach().clone())
        losses.append(loss.item())
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return outputs, losses, grads


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) our layer")
    args = parser.parse_args(argv)
    ours = train(True, args.steps, args.tokens, args.compile)
    plain = train(False, args.steps, args.tokens)
    names = [name for name, _ in TinyMoE().named_parameters()]
    print("step  loss (moe_routing)  loss (plain PyTorch)")
    for step, (a, b) in enumerate(zip(ours[1], plain[1])):
        print(f"{step:4d}  {a:18.8f}  {b:20.8f}")
    outputs_same = all(bitwise_equal(a, b) for a, b in zip(ours[0], plain[0]))
    losses_same = ours[1] == plain[1]
    differing = sorted({name for ga, gb in zip(ours[2], plain[2]) for name, a, b in zip(names, ga, gb)
                        if not bitwise_equal(a, b)})
    if outputs_same and losses_same and not differing:
        print(f"dispatch (moe_init_routing) -> experts -> combine (moe_finalize_routing): the layer's outputs, "
              f"losses and the gradients of {', '.join(names)} equal the plain-PyTorch layer's bit for bit "
              f"at every one of the {args.steps} steps")
        return 0
    summary = (f"outputs {'equal' if outputs_same else 'differ'}, losses {'equal' if losses_same else 'differ'}, "
               f"gradients differing: {', '.join(differing) or 'none'}")
    if args.compile:
        # Inductor regenerates PyTorch's own float operations around ours (softmax, matmuls), which
        # then round differently: compiled, the layer agrees to rounding, not bit for bit.
        worst = max((a - b).abs().max().item() for ga, gb in zip(ours[2], plain[2]) for a, b in zip(ga, gb))
        close = worst <= 1e-5 and all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in zip(ours[1], plain[1]))
        print(f"compiled (inductor): {summary}; largest gradient difference {worst:.3g} -> "
              f"{'agrees to rounding' if close else 'DIFFERS'}")
        return 0 if close else 1
    print(f"DIFFER from the plain-PyTorch layer: {summary}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
