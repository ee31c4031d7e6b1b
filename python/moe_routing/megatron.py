"""Megatron-Core's MoE permute / unpermute, deterministic, with a float32 combine in a fixed order:

    from moe_routing.megatron import permute, unpermute
    permuted, permuted_probs, sorted_indices, _, _ = permute(
        hidden, routing_map, probs=probs, num_out_tokens=n * topk)
    out = unpermute(expert_out, sorted_indices, hidden.shape, probs=probs, routing_map=routing_map)

A drop-in for `megatron.core.transformer.moe.moe_utils.permute` / `unpermute` (Megatron-Core main,
v0.17 and later: the same parameters, defaults and five-tuple; v0.13 - v0.16 callers take the first
three outputs). The results are those of Megatron's unfused path, except that unpermute always
sums in float32 (below); `fused=True` is accepted and runs the same code (Transformer Engine's
fused kernels return a different index layout, which only their own unpermute reads).

Row order (Megatron's): the permuted rows are grouped by expert in increasing expert id, each
expert's tokens in increasing token id; `sorted_indices[d]` is the token of row d (int64).

The combine, `unpermute`: out[n] = +0, then for each expert e of token n in increasing e,
acc = acc + float32(probs[n, e]) * float32(row) (each product rounded to float32; without probs
the row alone), then one round-to-nearest-even narrowing to the dtype of permuted_tokens. Bitwise
deterministic on every device and thread count. It is what Megatron's own unfused unpermute
computes when probs are float32 (its index_add / scatter_add order aside), and exactly its
batch-invariant unpermute on one expert-parallel rank; with bfloat16 probs or none, Megatron adds
in bfloat16 instead. The backward of permute is this same sum (no probs) of the rows' gradients.

How: the (token, expert) pairs of routing_map, N*E of them in row-major order, are sorted by a key
that puts the routed pairs first, expert-major, then the others (moe_init_routing_v2); the
combine is moe_finalize_routing over the same N*E pairs (K = E, unrouted pairs skipped) with
the `ascend_950` numerics. docs/porting.md gives the details and differences.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ._api import moe_init_routing_v2
from ._port import (FLOAT_DTYPES, by_slot, check_int, check_routing_map, check_tensor, first_true, reads_values,
                    renamed_errors, routed_slots, routing_map_keys, shape_argument, sorted_pairs, sorted_rows,
                    weighted_combine)

__all__ = ["permute", "unpermute"]

def _inverse_map(routing_map: torch.Tensor, pairs: torch.Tensor, num_out_tokens: int) -> torch.Tensor:
    """Megatron's batch-invariant inverse map [2, N, topk] (int64): for token n and slot s (its
    routed experts numbered in increasing id), the permuted row holding it and the expert id,
    -1 where none."""
    n, e = routing_map.shape
    if n == 0:
        return torch.empty((2, 0, 0), dtype=torch.long, device=pairs.device)
    topk = num_out_tokens // n
    slots = routed_slots(routing_map, topk)
    row_of_pair = pairs.new_full((n * e,), -1)  # batched under vmap as pairs (_port.by_slot)
    row_of_pair.scatter_(0, pairs, torch.arange(pairs.numel(), device=pairs.device))
    expert = torch.arange(e, device=pairs.device).expand(n, e)
    return torch.stack((by_slot(row_of_pair.view(n, e), slots, topk, -1), by_slot(expert, slots, topk, -1)))


def permute(tokens: torch.Tensor, routing_map: torch.Tensor, probs: Optional[torch.Tensor] = None,
            num_out_tokens: Optional[int] = None, fused: bool = False, drop_and_pad: bool = False,
            tokens_per_expert: Optional[torch.Tensor] = None, align_size: int = 0,
            return_batch_invariant_inverse_map: bool = False):
    """Megatron-Core's `moe_utils.permute`: group the tokens by expert.

    Args:
        tokens: [N, H] float32/float16/bfloat16.
        routing_map: [N, E] bool (or an integer 0/1 map; nonzero = routed).
        probs: optional [N, E] float32/float16/bfloat16, gathered along into permuted_probs.
        num_out_tokens: rows to produce: an int >= 0 or a 0-dim integer tensor; None (Megatron-Core
            v0.10 - v0.16 callers; eager mode only) means the routed pairs, dropless, as Megatron's
            permute reads None, drop_and_pad or not. Dropless: the first min(num_out_tokens, N*E)
            rows of Megatron's order (rows past
            the routed pairs are unrouted (expert, token) pairs, expert-major); drop_and_pad:
            capacity = num_out_tokens // E per expert.
        fused: accepted, ignored (the unfused path's results; see the module docstring).
        drop_and_pad: each expert gets exactly `capacity` rows: its routed tokens in increasing id,
            padded with its unrouted tokens in increasing id.
        tokens_per_expert: returned unchanged (Megatron's unfused path does the same).
        align_size: accepted, ignored (only Transformer Engine's fused padding uses it).
        return_batch_invariant_inverse_map: also return Megatron's batch-invariant inverse map
            (dropless, num_out_tokens a multiple of N, every token routed to exactly
            num_out_tokens / N experts - checked outside torch.compile) in the fourth slot.

    Returns:
        (permuted_input [rows, H] tokens' dtype, permuted_probs [rows] probs' dtype or None,
        sorted_indices int64 [rows] (the token of each row), the inverse map or None,
        tokens_per_expert). Differentiable in tokens and probs; the tokens' gradient sums each
        token's rows in float32 in increasing expert order (one narrowing).
    """
    function = "permute"
    check_tensor(function, "tokens", tokens, (2,), FLOAT_DTYPES, " [num_tokens, hidden]")
    check_routing_map(function, routing_map, probs, tokens.shape[0], {"tokens": tokens})
    if num_out_tokens is None:
        # Megatron-Core v0.10 - v0.16 take it as optional, and with None their permute takes the routed
        # pairs, dropless (its drop_and_pad branch needs a count); v0.17 and later require it. The
        # routed count is read from routing_map's values: not while torch.compile traces, nor on
        # tensors without values.
        if not reads_values(function, routing_map):
            raise ValueError(f"{function}: num_out_tokens must be given (None reads the routed count from "
                             f"routing_map, in eager mode on tensors with values only; Megatron-Core's "
                             f"dispatchers pass num_tokens * topk or the routed count), got None")
        num_out_tokens, drop_and_pad = int(torch.count_nonzero(routing_map)), False
    count = check_int(function, "num_out_tokens", num_out_tokens, minimum=0)
    if return_batch_invariant_inverse_map:
        if drop_and_pad:
            raise ValueError(f"{function}: return_batch_invariant_inverse_map needs dropless routing, got "
                             f"drop_and_pad=True")
        n = tokens.shape[0]
        if (count % n != 0) if n > 0 else (count != 0):
            raise ValueError(f"{function}: return_batch_invariant_inverse_map needs num_out_tokens a multiple of "
                             f"num_tokens {n} (a fixed top-k), got {count}")
        if n > 0 and reads_values(function, routing_map):
            # Every token must route exactly top-k experts, or its slots would spill into the next
            # token's (or take unrouted pairs) and the map would be silently wrong.
            routed = (routing_map != 0).sum(1)
            bad = first_true(routed != count // n)
            if bad is not None:
                raise ValueError(f"{function}: return_batch_invariant_inverse_map needs every token routed to "
                                 f"exactly num_out_tokens / num_tokens = {count // n} experts, got "
                                 f"{int(routed[bad])} for token {bad}")
    e = routing_map.shape[1]
    keys, rows = routing_map_keys(routing_map, count, drop_and_pad)
    # Its autograd backward adds each token's rows in float32 from +0 in slot (= expert) order:
    # the `sequential` order of numerics "ascend_950".
    permuted_input, row_idx = sorted_rows(function, tokens, keys, rows, "ascend_950", {"x": "tokens"})
    pairs = sorted_pairs(row_idx, rows)
    sorted_indices = pairs // e
    # A gather of probs at the rows' pairs (each pair once, so its gradient is a plain scatter).
    permuted_probs = None if probs is None else probs.reshape(-1).index_select(0, pairs)
    inverse_map = _inverse_map(routing_map, pairs, count) if return_batch_invariant_inverse_map else None
    return permuted_input, permuted_probs, sorted_indices, inverse_map, tokens_per_expert


def unpermute(permuted_tokens: torch.Tensor, sorted_indices: torch.Tensor, restore_shape: Sequence[int],
              probs: Optional[torch.Tensor] = None, routing_map: Optional[torch.Tensor] = None, fused: bool = False,
              drop_and_pad: bool = False, pad_offsets: Optional[torch.Tensor] = None,
              batch_invariant_inverse_map: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Megatron-Core's `moe_utils.unpermute`: out[n] = sum over token n's rows of prob * row.

    Args:
        permuted_tokens: [R, H] float32/float16/bfloat16, in permute's row order.
        sorted_indices: int64 (or int32) [R], permute's output: the token of each row. Checked
            against routing_map outside torch.compile (the rows' experts come from the map).
        restore_shape: (N, H), the output's shape.
        probs: optional [N, E] float32/float16/bfloat16 (the weight of row (n, e) is probs[n, e]).
        routing_map: [N, E], the map permute got - required (Megatron needs it only with probs;
            every Megatron dispatcher passes it).
        fused: accepted, ignored. drop_and_pad: as permute's (R = E * capacity).
        pad_offsets: must be None (only Transformer Engine's fused padding produces it).
        batch_invariant_inverse_map: accepted, ignored: this sum is batch-invariant anyway.

    Returns:
        [N, H], permuted_tokens' dtype: the float32 sum in increasing expert order of the module
        docstring. Differentiable in permuted_tokens and probs.
    """
    function = "unpermute"
    check_tensor(function, "permuted_tokens", permuted_tokens, (2,), FLOAT_DTYPES, " [rows, hidden]")
    check_tensor(function, "sorted_indices", sorted_indices, (1,), (torch.int64, torch.int32), " [rows]")
    rows, hidden = permuted_tokens.shape
    if sorted_indices.shape[0] != rows:
        raise ValueError(f"{function}: sorted_indices must have one entry per row of permuted_tokens ({rows}), got "
                         f"{sorted_indices.shape[0]}")
    if routing_map is None:
        raise ValueError(f"{function}: routing_map must be given (the rows' experts, which fix the order of the sum, "
                         f"come from it; Megatron-Core's dispatchers always pass it), got None")
    if pad_offsets is not None:
        raise ValueError(f"{function}: pad_offsets must be None (only Transformer Engine's fused permute pads; "
                         f"moe_routing's permute never does), got a tensor")
    check_routing_map(function, routing_map, probs, None,
                      {"permuted_tokens": permuted_tokens, "sorted_indices": sorted_indices})
    n, e = routing_map.shape
    shape = shape_argument(function, "restore_shape", restore_shape)
    if shape != [n, hidden]:
        raise ValueError(f"{function}: restore_shape must be [num_tokens, hidden] = {[n, hidden]}, got {shape}")
    if drop_and_pad and rows % e != 0:
        raise ValueError(f"{function}: with drop_and_pad, permuted_tokens must have num_experts * capacity rows "
                         f"(a multiple of {e}), got {rows}")
    keys, expected_rows = routing_map_keys(routing_map, rows, drop_and_pad)
    if expected_rows != rows:
        raise ValueError(f"{function}: permuted_tokens must have at most num_tokens * num_experts = {n * e} rows "
                         f"(permute's maximum), got {rows}")
    # The pair -> row permutation of permute's sort (the sort alone, on a zero-width x).
    _, row_idx, _, _ = moe_init_routing_v2(permuted_tokens.new_empty((n, 0)), keys)
    if reads_values(function, sorted_indices, routing_map, permuted_tokens):  # row_idx comes from both
        expected = sorted_pairs(row_idx, rows) // e
        bad = first_true(sorted_indices != expected)
        if bad is not None:
            raise ValueError(f"{function}: sorted_indices[{bad}] must be {int(expected[bad])} (the token of row "
                             f"{bad} in permute's order for this routing_map), got {int(sorted_indices[bad])}")
    # Pairs (n, e) at n*E + e, row layout with K = E; unrouted pairs' rows are >= R and skipped.
    return renamed_errors(function, lambda: weighted_combine(permuted_tokens, row_idx, probs, e),
                          {"expanded_x": "permuted_tokens", "scales": "probs"})
