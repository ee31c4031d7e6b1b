"""torch_npu's MoE routing functions, on CPU and CUDA:

    import moe_routing.torch_npu as torch_npu
    expanded_x, expanded_row_idx, counts, _ = torch_npu.npu_moe_init_routing_v2(
        x, topk_ids, active_num=n * k, expert_num=e, expert_tokens_num_type=1, expert_tokens_num_flag=True)
    out = torch_npu.npu_moe_token_unpermute(expert_out, expanded_row_idx, topk_weights)

Each function has torch_npu's name, parameters (names, order, positional / keyword-only, defaults)
and outputs (order, shapes, dtypes), and computes what the Atlas A2/A3 device computes, through
moe_routing's operators (no arithmetic of its own). Ours, keyword-only after torch_npu's
parameters: `numerics` ("atlas_a2", the default, or "ascend_950": which device's arithmetic).
Every function whose outputs are floating point is differentiable (torch_npu: only the token
permute / unpermute pair). docs/porting.md lists, per function, each difference from torch_npu and
its reason.

Index conventions: every torch_npu index here maps a source (token, choice) pair to its
destination row - in row layout (pair i*K + t) for npu_moe_init_routing_v2 and the token
permute / unpermute, in column layout (pair t*N + i) for npu_moe_init_routing (V1) and
npu_moe_finalize_routing's drop_pad_mode 0 / 1.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch

from ._api import INT32_MAX, moe_finalize_routing, moe_init_routing, moe_init_routing_grad, moe_init_routing_v2
from ._fake import _check_numerics
from ._port import (FLOAT_DTYPES, INDEX_DTYPES, check_device, check_int, check_routing_map, check_tensor,
                    by_slot, first_true, int32_index, position, reads_values, refuse_non_ints, renamed_errors,
                    routed_slots, routing_map_keys, shape_argument, sorted_pairs, sorted_rows, weighted_combine)

__all__ = ["npu_moe_init_routing", "npu_moe_init_routing_v2", "npu_moe_finalize_routing", "npu_moe_token_permute",
           "npu_moe_token_unpermute", "npu_moe_token_permute_with_routing_map",
           "npu_moe_token_unpermute_with_routing_map", "npu_moe_compute_expert_tokens"]


def npu_moe_init_routing(x: torch.Tensor, row_idx: torch.Tensor, expert_idx: torch.Tensor, active_num: int, *,
                         numerics: str = "atlas_a2"):
    """torch_npu.npu_moe_init_routing (aclnnMoeInitRouting, "V1"), differentiable in x.

    Args:
        x: [N, H] float32/float16/bfloat16.
        row_idx: int32 [N, K], the column-layout position of each pair: row_idx[i][t] = t*N + i
            (torch.arange(N*K, dtype=torch.int32).reshape(K, N).T, as torch_npu's documentation
            builds it). Any other tensor is a ValueError (checked outside torch.compile).
        expert_idx: int32 [N, K], expert ids >= 0.
        active_num: int >= 0, a number of **tokens**: the first min(N, active_num) * K sorted rows
            are produced (0: none).
        numerics: "atlas_a2" or "ascend_950": the summation order of the backward (tree /
            sequential); the forward is a copy either way.

    Returns:
        (expanded_x [min(N, active_num) * K, H] x's dtype, expanded_row_idx int32 [N*K],
        expanded_expert_idx int32 [N*K]): the pairs sorted stably by expert id (ties in row-major
        order i*K + t); expanded_x[d] = x[token of the d-th sorted pair]; expanded_row_idx[t*N + i]
        = the sorted row of pair (i, t) (column layout); expanded_expert_idx = the sorted expert
        ids (all N*K of them).
    """
    function = "npu_moe_init_routing"
    check_tensor(function, "x", x, (2,), FLOAT_DTYPES, " [N, H]")
    check_tensor(function, "row_idx", row_idx, (2,), (torch.int32,), " [N, K]")
    check_tensor(function, "expert_idx", expert_idx, (2,), (torch.int32,), " [N, K]")
    check_device(function, {"x": x, "row_idx": row_idx, "expert_idx": expert_idx})
    if row_idx.shape != expert_idx.shape:
        raise ValueError(f"{function}: row_idx must have expert_idx's shape {list(expert_idx.shape)}, got "
                         f"{list(row_idx.shape)}")
    if x.shape[0] != expert_idx.shape[0]:
        raise ValueError(f"{function}: expert_idx must have x's {x.shape[0]} rows, got {expert_idx.shape[0]}")
    active_num = check_int(function, "active_num", active_num, minimum=0)
    n, k = expert_idx.shape
    if reads_values(function, row_idx):
        canonical = torch.arange(n * k, dtype=torch.int32, device=row_idx.device).view(k, n).t()
        bad = first_true(row_idx != canonical)
        if bad is not None:
            i, t = divmod(bad, k)
            raise ValueError(f"{function}: row_idx{position(row_idx.shape, bad)} must be t*N + i = {t * n + i} "
                             f"(row_idx = arange(N*K).reshape(K, N).T, the column-layout position of each pair), "
                             f"got {int(row_idx[i, t])}")
    rows = min(n, active_num) * k
    expanded_x, row_layout = sorted_rows(function, x, expert_idx, rows, numerics, None)
    # Row layout (pair i*K + t) to torch_npu's column layout (pair t*N + i): a transpose.
    expanded_row_idx = row_layout.view(n, k).t().reshape(-1)
    expanded_expert_idx = torch.sort(expert_idx.reshape(-1), stable=True).values
    return expanded_x, expanded_row_idx, expanded_expert_idx


def npu_moe_init_routing_v2(x: torch.Tensor, expert_idx: torch.Tensor, *, scale: Optional[torch.Tensor] = None,
                            offset: Optional[torch.Tensor] = None, active_num: int = -1, expert_capacity: int = -1,
                            expert_num: int = -1, drop_pad_mode: int = 0, expert_tokens_num_type: int = 0,
                            expert_tokens_num_flag: bool = False, quant_mode: int = -1,
                            active_expert_range: Union[Sequence[int], int] = [],  # never mutated
                            row_idx_type: int = 0, x_dtype: Optional[int] = None, numerics: str = "atlas_a2"):
    """torch_npu.npu_moe_init_routing_v2 (aclnnMoeInitRoutingV3), differentiable in x and scale.

    The same routing as moe_routing.moe_init_routing (docs/moe_init_routing.md) with torch_npu's
    output conventions:

    Returns:
        (expanded_x, expanded_row_idx, expert_token_cumsum_or_count, expanded_scale):
        expanded_x [min(active_num, N*K), H] when active_num > 0 in dropless mode, else [N*K, H];
        [expert_num, expert_capacity, H] in drop-pad; x's dtype, int8 for quant_mode 0 / 1.
        expanded_row_idx int32 [N*K] (row_idx_type 0: pair -> row, -1 if not routed; 1: row ->
        pair). expert_token_cumsum_or_count int64 [end - start] (types 0 cumsum, 1 count) or
        [expert_num, 2] (type 2), zeros when expert_tokens_num_flag is False. expanded_scale
        float32 with one entry per row of expanded_x (zeros where nothing is gathered).
    active_expert_range [] (torch_npu's default) means [0, expert_num); a bare int v means
    [v, v] (torch_npu's int[2] schema type broadcasts it), which is refused (an empty range).
    """
    function = "npu_moe_init_routing_v2"
    check_tensor(function, "x", x, (2,), FLOAT_DTYPES + (torch.int8,), " [N, H]")
    check_tensor(function, "expert_idx", expert_idx, (2,), (torch.int32,), " [N, K]")
    if isinstance(active_expert_range, int) and not isinstance(active_expert_range, bool):
        active_expert_range = [active_expert_range, active_expert_range]
    elif (active_expert_range is not None and not isinstance(active_expert_range, (list, tuple))
          and not (isinstance(active_expert_range, torch.Tensor) and active_expert_range.dim() == 1)):
        # A NumPy or 0-d tensor scalar has no len(); anything but a list or tuple of two ints is refused.
        raise ValueError(f"{function}: active_expert_range must be a list of two ints [start, end] (or [] for all "
                         f"experts), got {active_expert_range!r}")
    empty = active_expert_range is None or len(active_expert_range) == 0
    expert_range = None if empty else list(active_expert_range)
    active_num = check_int(function, "active_num", active_num)
    refuse_non_ints(function, {"expert_capacity": expert_capacity, "expert_num": expert_num,
                               "drop_pad_mode": drop_pad_mode, "expert_tokens_num_type": expert_tokens_num_type,
                               "quant_mode": quant_mode, "row_idx_type": row_idx_type, "x_dtype": x_dtype})
    # torch_npu keeps every pair for any active_num <= 0; moe_init_routing's "all" is -1 / 0.
    expanded_x, expanded_row_idx, counts, expanded_scale, _ = renamed_errors(
        function, lambda: moe_init_routing(
            x, expert_idx, scale, offset, None, max(active_num, -1), expert_capacity, expert_num, drop_pad_mode,
            expert_tokens_num_type, expert_tokens_num_flag, quant_mode, expert_range, row_idx_type, x_dtype,
            numerics=numerics))
    if drop_pad_mode == 0 and active_num > 0:
        rows = min(active_num, expanded_x.shape[0])
        expanded_x, expanded_scale = expanded_x[:rows], expanded_scale[:rows]
    if not expert_tokens_num_flag and expert_tokens_num_type == 2:
        counts = counts.new_zeros((expert_num, 2))  # torch_npu allocates the key-value shape whatever the flag
    return expanded_x, expanded_row_idx, counts, expanded_scale


_MISSING = object()


def npu_moe_finalize_routing(expanded_permuted_rows: torch.Tensor, skip1: Optional[torch.Tensor],
                             skip2: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                             scales: Optional[torch.Tensor], expanded_src_to_dst_row: torch.Tensor,
                             export_for_source_row=_MISSING, drop_pad_mode: Optional[int] = 0,
                             k: Optional[int] = 1, *, expert_for_source_row=_MISSING,
                             numerics: str = "atlas_a2") -> torch.Tensor:
    """torch_npu.npu_moe_finalize_routing (aclnnMoeFinalizeRoutingV2/V4 on Atlas A2/A3),
    differentiable in expanded_permuted_rows, skip1, skip2, bias and scales:
    out[i] = skip1[i] + skip2[i] + sum_t scales[i, t] * (rows[index(i, t)] + bias[expert[i, t]]).

    skip1, skip2, bias, scales and the expert ids have no defaults (pass None), as in
    torch_npu's schema. The expert ids are `export_for_source_row` (the schema's spelling,
    positional or keyword) or `expert_for_source_row` (the spelling of torch_npu's documentation,
    keyword): exactly one of them. drop_pad_mode 0 / 1 read the index in column layout (t*N + i),
    2 / 3 in row layout (i*K + t); 1 / 3 take rows [E, C, H]. This is moe_finalize_routing with
    torch_npu's argument names (docs/moe_finalize_routing.md); `numerics="atlas_a2"` accumulates
    float16 in float16, as the A2/A3 kernels do.
    """
    function = "npu_moe_finalize_routing"
    if export_for_source_row is not _MISSING and expert_for_source_row is not _MISSING:
        raise TypeError(f"{function}: export_for_source_row and expert_for_source_row name the same argument "
                        f"(the schema's and the documentation's spelling); pass one, got both")
    if export_for_source_row is _MISSING:
        export_for_source_row = expert_for_source_row
    if export_for_source_row is _MISSING:
        raise TypeError(f"{function}: missing required argument export_for_source_row (the expert ids, or None), "
                        f"got neither it nor expert_for_source_row")
    refuse_non_ints(function, {"drop_pad_mode": drop_pad_mode, "k": k})
    names = {"expanded_x": "expanded_permuted_rows", "expanded_row_idx": "expanded_src_to_dst_row", "x1": "skip1",
             "x2": "skip2", "expert_idx": "export_for_source_row"}
    return renamed_errors(function, lambda: moe_finalize_routing(
        expanded_permuted_rows, expanded_src_to_dst_row, skip1, skip2, bias, scales, export_for_source_row,
        drop_pad_mode=drop_pad_mode, k=k, numerics=numerics), names)


# npu_moe_token_permute sorts its indices as floats: values in [0, 2^24) sort exactly, and the
# dtype's minimum and maximum are tolerated as sentinels that sort first and last. Our sort takes
# non-negative int32 keys: value v -> v + 1, the minimum -> 0, the maximum -> 2^24 + 1.
_EXACT_KEYS = 1 << 24


def _permute_keys(function: str, indices: torch.Tensor) -> torch.Tensor:
    info = torch.iinfo(indices.dtype)
    low, high = indices == info.min, indices == info.max
    valid = ((indices >= 0) & (indices < _EXACT_KEYS)) | low | high
    if reads_values(function, indices):
        bad = first_true(~valid)
        if bad is not None:
            raise IndexError(f"{function}: indices{position(indices.shape, bad)} must be in [0, {_EXACT_KEYS}) "
                             f"(torch_npu sorts them as float32; {info.min} and {info.max} are accepted as "
                             f"sentinels that sort first and last), got {int(indices.reshape(-1)[bad])}")
    keys = torch.where(low, 0, torch.where(high, _EXACT_KEYS + 1, indices + 1))
    # Under torch.compile an invalid value becomes -1, which the sort rejects (no wrong order).
    return torch.where(valid, keys, -1).to(torch.int32)


def npu_moe_token_permute(tokens: torch.Tensor, indices: torch.Tensor, num_out_tokens: Optional[int] = None,
                          padded_mode: bool = False, *, numerics: str = "atlas_a2"):
    """torch_npu.npu_moe_token_permute (aclnnMoeTokenPermute), differentiable in tokens.

    Args:
        tokens: [N, H] float32/float16/bfloat16.
        indices: [N, K] or [N] (K = 1), int32 or int64: each pair's expert (a sort key).
        num_out_tokens: rows produced: None or 0 -> N*K; n > 0 -> min(n, N*K); n < 0 -> N*K + n
            (n >= -N*K).
        padded_mode: must be False (torch_npu refuses True too).
        numerics: accepted for uniformity; the backward sums each token's rows in float32 from +0
            in slot order on both devices (the `sequential` order).

    Returns:
        (permuted_tokens [rows, H] tokens' dtype, sorted_indices int32 [N*K]): the pairs sorted
        stably by index value (ties in row-major order i*K + t); permuted_tokens[d] = tokens[token
        of the d-th pair]; sorted_indices[i*K + t] = the row of pair (i, t) (rows >= `rows` were
        cut) - pair -> row, the inverse of Megatron-Core's legacy sorted_indices.
    """
    function = "npu_moe_token_permute"
    check_tensor(function, "tokens", tokens, (2,), FLOAT_DTYPES, " [N, H]")
    check_tensor(function, "indices", indices, (1, 2), INDEX_DTYPES, " [N, K] or [N]")
    check_device(function, {"tokens": tokens, "indices": indices})
    _check_numerics(function, numerics)
    if indices.shape[0] != tokens.shape[0]:
        raise ValueError(f"{function}: indices must have tokens' {tokens.shape[0]} rows, got {indices.shape[0]}")
    if padded_mode:
        raise ValueError(f"{function}: padded_mode must be False (torch_npu's kernel has no padded mode either), "
                         f"got {padded_mode!r}")
    pairs = indices.numel()
    requested = 0 if num_out_tokens is None else check_int(function, "num_out_tokens", num_out_tokens,
                                                           minimum=-pairs)
    rows = min(requested, pairs) if requested > 0 else pairs + requested
    keys = _permute_keys(function, indices.view(indices.shape[0], 1) if indices.dim() == 1 else indices)
    # A2's MoeTokenPermuteGrad adds a token's slots one by one in float32 (the `sequential` order),
    # as the 950's forwarding to MoeInitRoutingV2Grad does: V2's backward under "ascend_950".
    return sorted_rows(function, tokens, keys, rows, "ascend_950", {"x": "tokens", "expert_idx": "indices"})


def npu_moe_token_unpermute(permuted_tokens: torch.Tensor, sorted_indices: torch.Tensor,
                            probs: Optional[torch.Tensor] = None, padded_mode: bool = False,
                            restore_shape: Optional[List[int]] = None, *, numerics: str = "atlas_a2") -> torch.Tensor:
    """torch_npu.npu_moe_token_unpermute (aclnnMoeTokenUnpermute), differentiable in
    permuted_tokens and probs: out[i] = sum_t probs[i, t] * permuted_tokens[sorted_indices[i*K + t]].

    Args:
        permuted_tokens: [R, H] float32/float16/bfloat16 (R <= N*K rows, e.g. after
            num_out_tokens).
        sorted_indices: int32 or int64 [N*K], pair -> row (npu_moe_token_permute's output, or
            npu_moe_init_routing_v2's expanded_row_idx). A value in [R, N*K) (a row that was cut)
            or -1 skips its pair.
        probs: optional [N, K] float32/float16/bfloat16; K = probs.size(1), else K = 1 (then out[p]
            = permuted_tokens[sorted_indices[p]], one row per pair).
        padded_mode: must be False. restore_shape: ignored (torch_npu uses it only in padded mode).
        numerics: "atlas_a2" (default): float32 accumulation for every dtype, and a pair whose
            prob is exactly 0 is skipped (Inf/NaN rows of masked experts do not poison the
            token); "ascend_950": the same sum without the skip (the 950 runs
            MoeFinalizeRoutingV2 instead). The sum: acc = +0, + the float32 product prob * row for
            t = 0, 1, ... in order, one round-to-nearest-even narrowing.

    Returns:
        [N*K / K, H], permuted_tokens' dtype.
    """
    function = "npu_moe_token_unpermute"
    check_tensor(function, "permuted_tokens", permuted_tokens, (2,), FLOAT_DTYPES, " [R, H]")
    check_tensor(function, "sorted_indices", sorted_indices, (1,), INDEX_DTYPES, " [N*K]")
    _check_numerics(function, numerics)
    if probs is not None:
        check_tensor(function, "probs", probs, (2,), FLOAT_DTYPES, " [N, K]")
        if probs.numel() != sorted_indices.numel():
            raise ValueError(f"{function}: probs must have one entry per pair ({sorted_indices.numel()}, the length "
                             f"of sorted_indices), got {list(probs.shape)}")
    check_device(function, {"permuted_tokens": permuted_tokens, "sorted_indices": sorted_indices, "probs": probs})
    if padded_mode:
        raise ValueError(f"{function}: padded_mode must be False (torch_npu's kernel has no padded mode either), "
                         f"got {padded_mode!r}")
    return _combine_pairs(function, permuted_tokens, sorted_indices, probs, 1, numerics)


def _combine_pairs(function: str, permuted_tokens: torch.Tensor, sorted_indices: torch.Tensor,
                   probs: Optional[torch.Tensor], k: int, numerics: str) -> torch.Tensor:
    """The combine of npu_moe_token_unpermute and the dropless npu_moe_token_unpermute_with_routing_map:
    out[i] = sum_t probs[i, t] * permuted_tokens[sorted_indices[i*K + t]] (K = probs.size(1), or k
    without probs: k = 1 copies one row per pair), in float32 from +0 in slot order, one narrowing;
    "atlas_a2" skips a pair whose prob is exactly 0. Arguments checked by the caller (`function`)."""
    pairs = sorted_indices.numel()
    index = int32_index(function, "sorted_indices", sorted_indices, -1, pairs,
                        "-1 or a row of permuted_tokens; rows >= its length were cut")
    rows = permuted_tokens.shape[0]
    names = {"expanded_x": "permuted_tokens", "grad_expanded_x": "permuted_tokens",
             "expanded_row_idx": "sorted_indices", "scales": "probs"}
    if rows > pairs:  # as moe_finalize_routing refuses it on the path with probs
        raise ValueError(f"{function}: permuted_tokens.size(0) must be at most N*K ({pairs}) in dropless mode, got "
                         f"{rows}")
    if probs is None and k > 1:
        # The rows alone, k per token: moe_finalize_routing without scales, float32 from +0 (its
        # "ascend_950" numerics), as the A2 kernel adds them; the gradient is a copy of grad_y.
        return renamed_errors(function, lambda: weighted_combine(permuted_tokens, index, None, k), names)
    if probs is None and rows > 0:
        # One row per pair, copied: the single-addend sum of moe_init_routing_grad (a copy, -0 kept).
        # With every row present that is its dropless scenario, whose own check refuses an index out of
        # [0, N*K). With rows cut, its active scenario skips every index >= rows; an index >= N*K is an
        # error, which the eager check above (int32_index) reports but a compiled graph has not: there
        # the missing rows are appended as zeros (what a skipped pair gives, +0) and the dropless
        # scenario checks the range.
        tokens, active = permuted_tokens, rows
        if rows == pairs:
            active = 0
        elif not reads_values(function, sorted_indices):
            tokens = torch.cat([permuted_tokens, permuted_tokens.new_zeros((pairs - rows, permuted_tokens.shape[1]))])
            active = 0
        return renamed_errors(function, lambda: moe_init_routing_grad(tokens, index, 1, 0, active,
                                                                      numerics=numerics), names)
    skip_zero = numerics == "atlas_a2"
    return renamed_errors(function, lambda: weighted_combine(
        permuted_tokens, index, probs, 1, skip_zero_scales=skip_zero, grad_numerics=numerics), names)


def npu_moe_token_permute_with_routing_map(tokens: torch.Tensor, routing_map: torch.Tensor, *,
                                           probs: Optional[torch.Tensor] = None,
                                           num_out_tokens: Optional[int] = None, drop_and_pad: bool = False,
                                           numerics: str = "atlas_a2"):
    """torch_npu.npu_moe_token_permute_with_routing_map (aclnnMoeTokenPermuteWithRoutingMap),
    differentiable in tokens and probs.

    Args:
        tokens: [N, H] float32/float16/bfloat16.
        routing_map: [N, E] bool or int8 (any integer map: nonzero = routed).
        probs: optional [N, E] float32/float16/bfloat16, gathered along into permuted_probs.
        num_out_tokens: int in [0, N*E]; None means N (torch_npu's default). Dropless: K =
            num_out_tokens // N, and every token must be routed to exactly K experts (checked
            outside torch.compile); drop_and_pad: capacity C = num_out_tokens // E, at most N.
        drop_and_pad: each expert gets exactly C rows: its routed tokens in increasing id, padded
            with its unrouted tokens in increasing id (Megatron-Core's drop_and_pad order).
        numerics: accepted for uniformity; the tokens' gradient adds each token's rows in float32
            from +0 in increasing expert order (the `sequential` order), one narrowing.

    Returns:
        (permuted_tokens [R, H] tokens' dtype, permuted_probs [R] probs' dtype or None,
        sorted_indices int32 [R]) with R = K*N (dropless) or C*E (drop_and_pad). The rows are
        expert-major, tokens ascending within an expert. sorted_indices: dropless pair -> row,
        sorted_indices[i*K + t] = the row of token i's t-th routed expert (increasing id), so
        permuted_tokens[sorted_indices[i*K + t]] = tokens[i]; drop_and_pad row -> token.
    """
    function = "npu_moe_token_permute_with_routing_map"
    check_tensor(function, "tokens", tokens, (2,), FLOAT_DTYPES, " [N, H]")
    check_routing_map(function, routing_map, probs, tokens.shape[0], {"tokens": tokens})
    _check_numerics(function, numerics)
    n, e = routing_map.shape
    count = n if num_out_tokens is None else check_int(function, "num_out_tokens", num_out_tokens, minimum=0)
    if count > n * e:
        raise ValueError(f"{function}: num_out_tokens must be at most num_tokens * num_experts = {n * e}, got {count}")
    if drop_and_pad:
        k = 0  # capacity num_out_tokens // E <= N by the bound above
    else:
        k = count // n if n > 0 else 0
        if reads_values(function, routing_map) and n > 0:
            routed = (routing_map != 0).sum(1)
            bad = first_true(routed != k)
            if bad is not None:
                raise ValueError(f"{function}: routing_map must route every token to num_out_tokens // num_tokens = "
                                 f"{k} experts (dropless mode), got {int(routed[bad])} for token {bad}")
    keys, rows = routing_map_keys(routing_map, k * n if not drop_and_pad else count, drop_and_pad)
    permuted_tokens, row_idx = sorted_rows(function, tokens, keys, rows, "ascend_950", {"x": "tokens"})
    pairs = sorted_pairs(row_idx, rows)
    # A gather of probs at the rows' pairs (each pair once: its gradient is an exact scatter).
    permuted_probs = None if probs is None else probs.reshape(-1).index_select(0, pairs)
    if drop_and_pad:
        sorted_indices = (pairs // e).to(torch.int32)
    else:
        # Pair (i, t) -> row: the rows of token i's routed experts, in increasing expert id.
        sorted_indices = by_slot(row_idx.view(n, e), routed_slots(routing_map, k), k, -1).reshape(-1)
    return permuted_tokens, permuted_probs, sorted_indices


def npu_moe_token_unpermute_with_routing_map(permuted_tokens: torch.Tensor, sorted_indices: torch.Tensor,
                                             restore_shape: Sequence[int], *, probs: Optional[torch.Tensor] = None,
                                             routing_map: Optional[torch.Tensor] = None, drop_and_pad: bool = False,
                                             numerics: str = "atlas_a2") -> torch.Tensor:
    """torch_npu.npu_moe_token_unpermute_with_routing_map (aclnnMoeTokenUnpermuteWithRoutingMap),
    differentiable in permuted_tokens and probs: out[n] = sum over token n's rows of prob * row.

    Args:
        permuted_tokens: [R, H] float32/float16/bfloat16.
        sorted_indices: int32 (or int64) [R'], npu_moe_token_permute_with_routing_map's output.
            Dropless: pair -> row, R' = N*K (K = R' // N), -1 skips a slot; drop_and_pad: row ->
            token, R' = R = E*C.
        restore_shape: [N, H], the output's shape.
        probs: optional [N, E]. Dropless: the weight of slot (i, t) is probs[i, e] for token i's
            t-th routed expert e of routing_map; drop_and_pad: the weight of row r is
            probs[sorted_indices[r], r // C].
        routing_map: [N, E]; required with probs in dropless mode, and in drop_and_pad mode when
            probs is None (it gives E); otherwise only checked.
        drop_and_pad: as permute's.
        numerics: dropless as npu_moe_token_unpermute ("atlas_a2": a pair whose prob is exactly 0
            adds nothing; "ascend_950": no skip); drop_and_pad ignores it.

    Returns:
        [N, H], permuted_tokens' dtype: acc = +0, then acc + the float32 product prob * row for each
        of the token's rows in increasing expert order (dropless: slot order), one
        round-to-nearest-even narrowing.
    """
    function = "npu_moe_token_unpermute_with_routing_map"
    check_tensor(function, "permuted_tokens", permuted_tokens, (2,), FLOAT_DTYPES, " [R, H]")
    check_tensor(function, "sorted_indices", sorted_indices, (1,), INDEX_DTYPES, " [R]")
    _check_numerics(function, numerics)
    shape = shape_argument(function, "restore_shape", restore_shape)
    rows, hidden = permuted_tokens.shape
    if len(shape) != 2 or shape[1] != hidden:
        raise ValueError(f"{function}: restore_shape must be [num_tokens, hidden] with permuted_tokens' hidden "
                         f"{hidden}, got {shape}")
    n = shape[0]
    first = {"permuted_tokens": permuted_tokens, "sorted_indices": sorted_indices}
    if routing_map is not None:
        check_routing_map(function, routing_map, probs, n, first)
    elif probs is not None:
        check_tensor(function, "probs", probs, (2,), FLOAT_DTYPES, " [num_tokens, num_experts]")
        if probs.shape[0] != n:
            raise ValueError(f"{function}: probs must have restore_shape[0] = {n} rows, got {list(probs.shape)}")
        check_device(function, {**first, "probs": probs})
    else:
        check_device(function, first)
    slots = sorted_indices.shape[0]
    if not drop_and_pad:
        if (slots % n != 0) if n > 0 else (slots != 0):
            raise ValueError(f"{function}: sorted_indices must have num_tokens * topK entries (a multiple of "
                             f"restore_shape[0] = {n}), got {slots}")
        if probs is not None and routing_map is None:
            raise ValueError(f"{function}: routing_map must be given with probs in dropless mode (it names each "
                             f"slot's expert), got None")
        if n == 0 and rows > 0:  # as _combine_pairs refuses rows beyond the N*K slots
            raise ValueError(f"{function}: permuted_tokens.size(0) must be at most N*K (0) in dropless mode, "
                             f"got {rows}")
        k = slots // n if n > 0 else 0  # no tokens: no slots, as K = 0 below
        pair_probs = None
        if probs is not None:
            routed = routing_map != 0
            if reads_values(function, routing_map):
                bad = first_true(routed.sum(1) > k)
                if bad is not None:
                    raise ValueError(f"{function}: routing_map must route each token to at most topK = "
                                     f"len(sorted_indices) // num_tokens = {k} experts, got "
                                     f"{int(routed[bad].sum())} for token {bad}")
        if k == 0 and rows == 0:
            # No slots (a permute whose num_out_tokens was below N): every token's sum is empty, +0. As
            # one slot per token that no row fills (-1, skipped): [N, H] zeros on the autograd graph
            # (the combine of k = 0 slots had no token count to give, and refused probs).
            sorted_indices, k = sorted_indices.new_full((n,), -1), 1
        if probs is not None:
            # probs of each slot (token i's t-th routed expert), 0 for a slot no expert fills.
            where = routed_slots(routing_map, k)
            experts = by_slot(torch.arange(probs.shape[1], device=probs.device).expand(n, -1), where, k, 0)
            filled = by_slot(routed.expand(n, -1), where, k, False)
            pair_probs = torch.where(filled, probs.gather(1, experts), 0)
        return _combine_pairs(function, permuted_tokens, sorted_indices, pair_probs, k, numerics)
    if probs is not None:
        e = probs.shape[1]
    elif routing_map is not None:
        e = routing_map.shape[1]
    else:
        raise ValueError(f"{function}: routing_map or probs must be given in drop_and_pad mode (num_experts, which "
                         f"fixes each row's expert r // capacity, comes from them), got neither")
    if e < 1 or slots != rows or rows % e != 0:
        raise ValueError(f"{function}: with drop_and_pad, sorted_indices and permuted_tokens must have "
                         f"num_experts * capacity entries (a multiple of {e}), got {slots} and {rows}")
    capacity = rows // e
    token = int32_index(function, "sorted_indices", sorted_indices, 0, n, "a token of restore_shape[0]").long()
    row = torch.arange(rows, device=token.device)
    pair = token * e + row // max(capacity, 1)
    checked = reads_values(function, sorted_indices)
    if checked and rows > 0:
        taken = torch.zeros(n * e, dtype=torch.long, device=token.device).index_add_(0, pair, torch.ones_like(pair))
        bad = first_true(taken[pair] > 1)
        if bad is not None:
            raise ValueError(f"{function}: sorted_indices[{bad}] must name a token once per expert (a permute's "
                             f"drop_and_pad rows), got token {int(token[bad])} twice for expert {bad // capacity}")
    spare = 0
    if not checked:
        # Compiled (or no values): nothing above read the tokens. One outside [0, N) would make the scatter
        # below write out of bounds (a device-side assert on CUDA), and a (token, expert) named twice would
        # lose a row; such pairs go to a spare slot past the N*E, and any of them turns the whole index
        # into INT32_MIN, which the combine refuses (as a compiled dropless call refuses a bad index).
        if n == 0 and rows > 0:
            raise IndexError(f"{function}: sorted_indices must be empty when restore_shape[0] is 0 (no token to "
                             f"name), got {rows} entries")
        valid = (token >= 0) & (token < n)
        pair = torch.where(valid, pair, n * e)
        taken = torch.zeros(n * e + 1, dtype=torch.long, device=token.device).index_add_(0, pair,
                                                                                          torch.ones_like(pair))
        refused = ((~valid) | (taken[pair] > 1)).any()
        spare = 1
    # Pairs (n, e) at n*E + e, row layout with K = E; a pair with no row keeps -1 (skipped).
    index = torch.full((n * e + spare,), -1, dtype=torch.int32, device=token.device)
    index = index.scatter_(0, pair, row.to(torch.int32))[:n * e]
    if not checked:
        index = torch.where(refused, -INT32_MAX - 1, index)
    names = {"expanded_x": "permuted_tokens", "grad_expanded_x": "permuted_tokens", "scales": "probs"}
    return renamed_errors(function, lambda: weighted_combine(permuted_tokens, index, probs, e), names)


def npu_moe_compute_expert_tokens(sorted_expert_for_source_row: torch.Tensor, num_expert: int) -> torch.Tensor:
    """torch_npu.npu_moe_compute_expert_tokens (aclnnMoeComputeExpertTokens).

    Args:
        sorted_expert_for_source_row: int32 1-D, expert ids in [0, num_expert), sorted ascending
            (npu_moe_init_routing's expanded_expert_idx).
        num_expert: E >= 1.

    Returns:
        int32 [E]: out[e] = the number of entries <= e (the end of expert e's rows; torch_npu finds
        it by binary search, which for sorted input is the same).
    """
    function = "npu_moe_compute_expert_tokens"
    check_tensor(function, "sorted_expert_for_source_row", sorted_expert_for_source_row, (1,), (torch.int32,))
    num_expert = check_int(function, "num_expert", num_expert, minimum=1)
    ids = int32_index(function, "sorted_expert_for_source_row", sorted_expert_for_source_row, 0, num_expert,
                      "an expert id below num_expert").view(-1, 1)
    # The inclusive cumulative count of moe_init_routing_v2 (flag 1), over a zero-width x.
    empty = torch.empty((ids.shape[0], 0), dtype=torch.float32, device=ids.device)
    _, _, cumsum, _ = renamed_errors(function, lambda: moe_init_routing_v2(empty, ids, 0, 0, num_expert, 0, 1),
                                     {"expert_idx": "sorted_expert_for_source_row", "expert_num": "num_expert"})
    return cumsum
