"""Expert-parallel dispatch and combine on moe_routing's operators (docs/distributed.md).

Layout. Experts are owned in contiguous blocks: rank r of W owns [r*E/W, (r+1)*E/W). Global
tokens are numbered rank-major (rank 0's tokens first), so the global pair index p = i*K + t
orders pairs by (source rank, source token, choice). The single-device expanded_x of the global
batch is expert-major, and within an expert in increasing p; its rows for rank r's experts are
exactly the rows rank r receives, in the same order. With a capacity C, expert e keeps its first
C pairs in that order: rank r keeps its first clamp(C - sum_{s<r} c_s[e], 0, c_r[e]) pairs of e,
where c_s[e] is rank s's count.

Traffic. Rows that are summed on the token's rank (the combine forward, the dispatch backward)
travel once per kept pair; rows that are only copied or multiplied (the dispatch forward, the
combine backward) travel once per (token, destination rank), however many of the token's experts
that rank owns.

Arithmetic. The only arithmetic is in our operators, each call seeing the same terms in the same
order as the single-device call on the global batch (docs/decisions.md §17):

* dispatch forward: only moves bytes. A token's row goes once to each rank owning one of its
  experts (with its K expert ids), and the owner expands it to one row per pair, expert-major.
* dispatch backward: moe_init_routing_grad on the token's rank, over that token's K rows, in the
  drop_pad_mode the single-device call has (0 dropless, 1 with a capacity).
* combine forward: moe_finalize_routing on the token's rank over its K pairs (drop_pad_mode 2,
  dropped pairs -1; mode 2 and 3 run the same per-token sum).
* combine backward: a token's grad_y row and K scales go once to each rank owning one of its
  experts, which calls moe_finalize_routing_grad on the received tokens with the pairs of other
  ranks' experts (and dropped pairs) marked -1: each pair's gradient row (grad_y * scale, one
  narrowing) and grad_scales term (the sum over H of the same products) are per pair, and
  grad_bias sums, per expert, the pairs in increasing global p (the received order), exactly as the
  single-device call does. grad_scales return to the token's rank; the owners' grad_bias blocks are
  all-gathered, so every rank holds the global batch's grad_bias.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch

from .. import _cache
from .._fake import _check_numerics
from .._port import check_int, dtype_name
from ._comm import Comm, _AllToAll, staging

_init_routing_grad = torch.ops.moe_routing.moe_init_routing_grad
_finalize = torch.ops.moe_routing.moe_finalize_routing
_finalize_grad = torch.ops.moe_routing.moe_finalize_routing_grad

# Every rank sends one fixed-length int64 message first (whatever it was called with), so that
# ranks which disagree still complete the exchange and can all raise the same error:
# [header | local error text | payload]. The dispatch's payload (per-expert pair counts, then
# per-destination token counts: E + W words) beyond the first message's room follows in further
# messages of the same length, sent only once every rank agrees on E.
_MESSAGE_WORDS = 512
_HEADER_WORDS = 32
_TEXT_WORDS = 48  # 384 bytes of UTF-8
_PAYLOAD_WORDS = _MESSAGE_WORDS - _HEADER_WORDS - _TEXT_WORDS
_MAGIC = 0x4D6F455044495354  # "MoEPDIST"

_DTYPE_CODES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
_DTYPE_NAMES = {0: "none", -1: "other", **{code: dtype_name(dtype) for dtype, code in _DTYPE_CODES.items()}}
_NUMERICS_CODES = {"atlas_a2": 1, "ascend_950": 2}
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
_OP_CODES = {"dispatch": 1, "combine": 2, "replicate_rows": 3, "all_to_all": 4, "local_rows": 5}
# Every dtype, numbered the same way in every process (of one PyTorch version): replicate_rows' rows.
_ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
_ROW_SIZES = 8  # replicate_rows: the sizes after the first compared one by one (beyond: their product)

# Header fields: (position, name used in the disagreement message, how to print a value).
_F_MAGIC, _F_OP, _F_WORLD, _F_HAS_ERROR, _F_TEXT_BYTES, _F_TOKENS = 0, 1, 2, 3, 4, 5
# Every operation's tensors' device type, at one position past every operation's other fields: a
# rank passing CPU tensors while its peers pass CUDA (or NPU) ones would meet the backend's error
# alone in the rows' exchange (NCCL refuses CPU tensors) while its peers wait in it.
_F_DEVICE = 18


def _device_code(t: torch.Tensor) -> int:
    """t's device type ("cpu", "cuda", "npu", ...) as one int64 word: the first 8 bytes of its
    name (every PyTorch device type but the unrenamed "privateuseone" is shorter)."""
    return int.from_bytes(t.device.type.encode("utf-8")[:8], "little", signed=True)


def _device_name(code: int) -> str:
    return code.to_bytes(8, "little", signed=True).rstrip(b"\0").decode("utf-8", errors="replace") or "none"


_AGREED_FIELDS = {
    "dispatch": [(6, "num_experts", str), (7, "the hidden size H (x.size(1))", str),
                 (8, "the top-k K (expert_idx.size(1))", str), (9, "the dtype of x", _DTYPE_NAMES.get),
                 (_F_DEVICE, "the device type of x", _device_name),
                 (10, "expert_capacity", lambda v: "None" if v < 0 else str(v)),
                 (11, "numerics", lambda v: {1: "atlas_a2", 2: "ascend_950"}.get(v, "?")),
                 (12, "x.requires_grad (with grad mode)", lambda v: str(bool(v)))],
    "combine": [(6, "the dispatch handle's num_experts", str), (7, "the dispatch handle's H", str),
                (8, "the dispatch handle's K", str), (9, "the dtype of expert_out", _DTYPE_NAMES.get),
                (_F_DEVICE, "the device type of expert_out", _device_name),
                (10, "the dispatch handle's expert_capacity", lambda v: "None" if v < 0 else str(v)),
                (11, "numerics", lambda v: {1: "atlas_a2", 2: "ascend_950"}.get(v, "?")),
                (12, "whether scales is given, and its dtype", lambda v: _DTYPE_NAMES.get(v, "?")),
                (13, "whether bias is given", lambda v: str(bool(v))),
                (14, "expert_out.requires_grad", lambda v: str(bool(v))),
                (15, "scales.requires_grad", lambda v: str(bool(v))),
                (16, "bias.requires_grad", lambda v: str(bool(v))),
                (17, "the dispatch the handle comes from (the group's dispatches, counted from 1)", str)],
}
# Autograd flags are agreed exactly where they decide whether a backward runs a collective (which
# must run on every rank or on none): x's (dispatch), expert_out's, scales' and bias' (combine),
# rows' (all_to_all, replicate_rows: local_rows' backward all-gathers). x1's and x2's are not:
# their gradient is grad_y itself, on their own rank.
# replicate_rows and all_to_all: the rows' dimensions, sizes after the first and dtype (rows of
# different byte widths on two ranks make gloo abort the process).
# local_rows' backward: the same fields of the gradient it all-gathers (a rank whose replicated
# computation ran in another dtype or shape once sent rows of another byte width, or of the same
# width reinterpreted: a wrong gradient).
_F_ROWS_REQUIRE_GRAD = 9 + _ROW_SIZES
assert _F_ROWS_REQUIRE_GRAD < _F_DEVICE < _HEADER_WORDS


def _row_agreement(rows: str) -> list:
    """The agreed fields of row_fields, naming the rows `rows` in the disagreement message."""
    return ([(6, f"{rows}.dim()", str)]
            + [(7 + i, f"{rows}.size({i + 1})", lambda v: "none" if v < 0 else str(v)) for i in range(_ROW_SIZES)]
            + [(7 + _ROW_SIZES, "the number of elements of a row", str),
               (8 + _ROW_SIZES, f"the dtype of {rows}", lambda v: dtype_name(_ALL_DTYPES[v])),
               (_F_DEVICE, f"the device type of {rows}", _device_name),
               (_F_ROWS_REQUIRE_GRAD, f"{rows}.requires_grad (with grad mode)", lambda v: str(bool(v)))])


_AGREED_FIELDS["replicate_rows"] = _row_agreement("rows")
_AGREED_FIELDS["all_to_all"] = _row_agreement("rows")
_AGREED_FIELDS["local_rows"] = _row_agreement("grad_output")

# Dispatches so far per group name, on this process: every rank of a group makes the same calls in
# the same order, so a handle's number is the same on every rank exactly when they all pass the
# handle of the same dispatch to combine. Handles of different dispatches make the ranks' split
# sizes disagree (gloo aborts the process) or, with equal counts, route rows wrongly.
_DISPATCHES: dict = {}


class DispatchHandle:
    """What `combine` and the backwards need to route rows back; returned by `dispatch`.

    Public, read-only attributes: num_experts, local_experts (E/W), first_expert (r*E/W),
    top_k, hidden, dtype, expert_capacity (None: dropless), numerics, num_tokens (this rank's N),
    tokens_per_rank (every rank's N), tokens_per_local_expert (int64 [E/W], CPU: rows of each
    local expert, after capacity), counts (int64 [W, E], CPU: every rank's pairs per expert,
    before capacity), send_splits / recv_splits (rows sent to / received from each rank). The rest
    is internal."""

    def __init__(self):
        self.comm: Comm
        self.num_experts = self.local_experts = self.first_expert = self.top_k = self.hidden = 0
        self.dtype: torch.dtype
        self.expert_capacity: Optional[int] = None
        self.numerics = "atlas_a2"
        self.num_tokens = 0
        self.tokens_per_rank: List[int] = []
        self.expert_idx: torch.Tensor
        self.counts: torch.Tensor
        self.tokens_per_local_expert: torch.Tensor
        # Pair rows (combine forward, dispatch backward): kept pairs per rank; token rows
        # (dispatch forward, combine backward): a token once per rank owning one of its experts.
        self.send_splits: List[int] = []
        self.recv_splits: List[int] = []
        self.token_send_splits: List[int] = []
        self.token_recv_splits: List[int] = []
        # Token side: sent_tokens = the tokens sent, rank-major; local_index[p] = the row of local
        # pair p among the kept pairs in send order, or -1 (dropped); kept_pairs = the pair of each
        # such row; scales_back = where its grad_scales is among the [sent tokens, K] coming back.
        self.sent_tokens: torch.Tensor
        self.local_index: torch.Tensor
        self.kept_pairs: torch.Tensor
        self.scales_back: torch.Tensor
        # Owner side: received pairs numbered m (source-rank-major, then local expert, then token
        # and choice); owner_index[m] = its row (dropless) or slot (capacity) of recv_x,
        # owner_gather the inverse (an unfilled slot: m = received, none); expand[r] = the received
        # token row recv_x's row r copies (a zero row for an unfilled slot); owner_pair_index /
        # owner_pair_experts = for every received (token, choice), its recv_x row (-1: not this
        # rank's or dropped) and local expert.
        self.received_tokens = 0
        self.owner_block_len: torch.Tensor
        self.owner_index: torch.Tensor
        self.owner_gather: torch.Tensor
        self.expand: torch.Tensor
        self.owner_pair_index: torch.Tensor
        self.owner_pair_experts: torch.Tensor
        self.recv_shape: Tuple[int, ...] = ()
        self.serial = 0  # which of its group's dispatches made it (compared by combine)

    @property
    def kept_rows_count(self) -> int:
        return int(sum(self.send_splits))

    @property
    def received_rows(self) -> int:
        return int(sum(self.recv_splits))


# ---- the agreement exchange -------------------------------------------------------------------------

def _message(op: str, comm: Comm, fields: dict, error: Optional[str], tokens: int,
             payload: Optional[torch.Tensor], device: torch.device) -> torch.Tensor:
    message = torch.zeros(_MESSAGE_WORDS, dtype=torch.int64)
    message[_F_MAGIC] = _MAGIC
    message[_F_OP] = _OP_CODES[op]
    message[_F_WORLD] = comm.world
    message[_F_TOKENS] = tokens
    for position, value in fields.items():
        message[position] = int(value)
    if error is not None:
        text = error.encode("utf-8")[:_TEXT_WORDS * 8]
        message[_F_HAS_ERROR] = 1
        message[_F_TEXT_BYTES] = len(text)
        padded = text + b"\0" * (_TEXT_WORDS * 8 - len(text))
        message[_HEADER_WORDS:_HEADER_WORDS + _TEXT_WORDS] = torch.frombuffer(bytearray(padded), dtype=torch.int64)
    if payload is not None:
        first = payload[:_PAYLOAD_WORDS]
        message[_HEADER_WORDS + _TEXT_WORDS:_HEADER_WORDS + _TEXT_WORDS + first.numel()] = first
    return message.to(device)


def _by_rank(values: Sequence[int], show) -> str:
    groups: dict = {}
    for rank, value in enumerate(values):
        groups.setdefault(int(value), []).append(rank)
    parts = []
    for value, ranks in groups.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)
        parts.append(f"{show(value)} ({who})")
    return ", ".join(parts)


def _check_table(op: str, table: torch.Tensor, comm: Comm) -> None:
    """Raises the same ValueError on every rank when any rank reported an error or the ranks
    disagree; `table` is [W, _MESSAGE_WORDS], identical on every rank."""
    prefix = f"moe_routing.distributed.{op}"
    if not bool((table[:, _F_MAGIC] == _MAGIC).all()):
        raise RuntimeError(f"{prefix}: rank {comm.rank}: the agreement exchange returned a message that is not "
                           f"moe_routing's (another collective ran on this group at the same time)")
    ops = table[:, _F_OP].tolist()
    if len(set(ops)) != 1:
        names = {code: name for name, code in _OP_CODES.items()}
        raise ValueError(f"moe_routing.distributed: every rank must call the same operation at the same time, got "
                         f"{_by_rank(ops, lambda v: names.get(v, '?'))}")
    worlds = table[:, _F_WORLD].tolist()
    if len(set(worlds)) != 1:
        raise ValueError(f"{prefix}: every rank must use the same group, got world sizes {_by_rank(worlds, str)}")
    failing = [r for r in range(table.shape[0]) if int(table[r, _F_HAS_ERROR])]
    if failing:
        r = failing[0]
        size = int(table[r, _F_TEXT_BYTES])
        raw = table[r, _HEADER_WORDS:_HEADER_WORDS + _TEXT_WORDS].contiguous().numpy().tobytes()[:size]
        text = raw.decode("utf-8", errors="replace")
        others = f", and on rank{'s' if len(failing) > 2 else ''} {', '.join(map(str, failing[1:]))}" \
            if len(failing) > 1 else ""
        raise ValueError(f"{text} (on rank {r}{others})")
    for position, name, show in _AGREED_FIELDS[op]:
        values = table[:, position].tolist()
        if len(set(values)) != 1:
            raise ValueError(f"{prefix}: {name} must be the same on every rank, got {_by_rank(values, show)}")


def row_fields(op: str, rows) -> Tuple[dict, Optional[str]]:
    """The agreement fields of replicate_rows' or all_to_all's rows [N_r, ...] (with whether they
    need a gradient: both backwards are collectives), or the error text when rows is not such a
    tensor."""
    try:
        _check_dense(f"moe_routing.distributed.{op}", "rows", rows)
    except ValueError as failure:
        return {}, str(failure)
    if not isinstance(rows, torch.Tensor) or rows.dim() < 1:
        return {}, f"moe_routing.distributed.{op}: rows must be a tensor [N_r, ...], got {_describe(rows)}"
    trailing = list(rows.shape[1:])
    sizes = (trailing + [-1] * _ROW_SIZES)[:_ROW_SIZES]
    return {6: rows.dim(), **{7 + i: size for i, size in enumerate(sizes)}, 7 + _ROW_SIZES: math.prod(trailing),
            8 + _ROW_SIZES: _ALL_DTYPES.index(rows.dtype), _F_ROWS_REQUIRE_GRAD: int(_requires_grad(rows)),
            _F_DEVICE: _device_code(rows)}, None


def _exchange(op: str, comm: Comm, fields: dict, error: Optional[str], tokens: int,
              payload: Optional[torch.Tensor]) -> torch.Tensor:
    message = _message(op, comm, fields, error, tokens, payload, comm.meta_device())
    step = "agreement and counts exchange (all_gather)" if payload is not None else "agreement exchange (all_gather)"
    table = comm.all_gather_fixed(message, step).cpu()
    _check_table(op, table, comm)
    return table


def all_to_all(rows: torch.Tensor, output_split_sizes: List[int], input_split_sizes: List[int], *,
               group=None) -> torch.Tensor:
    """Differentiable all_to_all_single along dim 0 with the output on rows' device.

    Args:
        rows: [sum(input_split_sizes), ...] any dtype; rows input_split_sizes[d] go to rank d.
        output_split_sizes: rows received from each rank (list of world-size ints).
        input_split_sizes: rows sent to each rank.
        group: the process group (None: the default group; a world of one when torch.distributed
            is not initialised).

    Returns:
        [sum(output_split_sizes), ...], the blocks from rank 0, 1, ... in order. Its gradient is the
        reverse exchange of the output's gradient. Bytes travel as they are (uint8 views).

    Raises:
        ValueError: bad arguments on any rank, split sizes the ranks disagree on (what rank s sends
            rank d is not what d expects from s), rows of different dimensions, sizes after the
            first, dtypes or device types, or rows needing a gradient on some ranks only (the
            backward is a collective): the same error on every rank (one agreement exchange first; gloo
            otherwise left the unsent rows uninitialised, or aborted the process).
        RuntimeError: the collective failed or timed out (naming the operation and rank).
    """
    comm = Comm(group, "all_to_all")
    op = "moe_routing.distributed.all_to_all"
    fields, error = row_fields("all_to_all", rows)  # with the gradient flag: the backward is the
    # reverse exchange, on every rank or on none
    splits = {}
    for name, given in (("output_split_sizes", output_split_sizes), ("input_split_sizes", input_split_sizes)):
        try:  # ints or 0-dim integer tensors, as check_int takes them (no float, bool or string)
            splits[name] = [check_int(op, name, s) for s in given]
        except (TypeError, ValueError):
            splits[name] = None
        if error is None and (splits[name] is None or len(splits[name]) != comm.world or min(splits[name]) < 0):
            error = (f"{op}: {name} must be {comm.world} non-negative ints (one per rank), got "
                     f"{splits[name] if splits[name] is not None else given!r}")
        # They travel in the int64 agreement message: a larger one once failed there, on this rank
        # alone, while its peers waited in the exchange.
        if error is None and max(splits[name]) > _INT64_MAX:
            error = f"{op}: {name} must be at most {_INT64_MAX} each (int64), got {max(splits[name])}"
    output_splits, input_splits = splits["output_split_sizes"], splits["input_split_sizes"]
    if error is None and sum(input_splits) != rows.shape[0]:
        error = f"{op}: sum(input_split_sizes) must equal rows.size(0) ({rows.shape[0]}), got {sum(input_splits)}"
    payload = None if error is not None else torch.tensor(input_splits + output_splits, dtype=torch.int64)
    table = _exchange("all_to_all", comm, fields, error, rows.shape[0] if error is None else 0, payload)
    everything = _gather_payload(table, payload, 2 * comm.world, comm)
    sends, expects = everything[:, :comm.world], everything[:, comm.world:]  # [source, destination]
    differ = (sends != expects.t()).nonzero()
    if differ.numel():
        source, destination = differ[0].tolist()
        raise ValueError(f"{op}: output_split_sizes must be what the ranks send, got rank {destination} expecting "
                         f"{int(expects[destination, source])} rows from rank {source}, which sends it "
                         f"{int(sends[source, destination])}")
    return _AllToAll.apply(rows, output_splits, input_splits, comm)


# ---- dispatch ---------------------------------------------------------------------------------------

def _dispatch_checks(x, expert_idx, num_experts, expert_capacity, numerics, world) -> Tuple[int, Optional[int]]:
    op = "moe_routing.distributed.dispatch"
    _check_dense(op, "x", x)
    _check_dense(op, "expert_idx", expert_idx)
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in _DTYPE_CODES:
        raise ValueError(f"{op}: x must be a 2-D float32, float16 or bfloat16 tensor [N, H], got "
                         f"{_describe(x)}")
    if (not isinstance(expert_idx, torch.Tensor) or expert_idx.dim() != 2 or expert_idx.dtype != torch.int32
            or expert_idx.shape[0] != x.shape[0] or expert_idx.shape[1] < 1):
        raise ValueError(f"{op}: expert_idx must be a 2-D int32 tensor [N, K] with N = x.size(0) ({x.shape[0]}) "
                         f"and K >= 1, got {_describe(expert_idx)}")
    if expert_idx.device != x.device:
        raise ValueError(f"{op}: expert_idx must be on the device of x ({x.device}), got {expert_idx.device}")
    if x.shape[1] < 1:  # rows of no bytes: the exchanges' row views would be ambiguous
        raise ValueError(f"{op}: x must have at least one column (H >= 1), got {_describe(x)}")
    experts = check_int(op, "num_experts", num_experts, minimum=1)
    if experts > _INT32_MAX:  # before any E-sized buffer: the ids are int32, as single-device
        raise ValueError(f"{op}: num_experts must be at most {_INT32_MAX} (int32 expert ids), got {experts}")
    if experts % world:
        raise ValueError(f"{op}: num_experts must be divisible by the world size ({world}), got {experts}")
    capacity = None if expert_capacity is None else check_int(op, "expert_capacity", expert_capacity, minimum=1)
    _check_numerics(op, numerics)
    # The single-device operators' int32 limits, checked here (inside the agreement) so that no
    # rank meets them alone later, in an operator or in the agreement message, while its peers
    # wait in a collective.
    if expert_idx.numel() > _INT32_MAX:
        raise ValueError(f"{op}: expert_idx must have at most {_INT32_MAX} elements (N * K: int32 row indices), "
                         f"got {expert_idx.shape[0]} * {expert_idx.shape[1]}")
    if capacity is not None and experts * capacity > _INT32_MAX:
        raise ValueError(f"{op}: num_experts * expert_capacity must be at most {_INT32_MAX} (int32 row indices, as "
                         f"single-device drop-pad), got {experts} * {capacity}")
    if expert_idx.numel():
        low, high = int(expert_idx.min()), int(expert_idx.max())
        if low < 0 or high >= experts:
            bad = low if low < 0 else high
            raise ValueError(f"{op}: expert_idx values must be in [0, num_experts) = [0, {experts}), got {bad}")
    return experts, capacity


def _describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{t.dim()}-D {dtype_name(t.dtype)} {list(t.shape)} on {t.device}"


def _check_dense(op: str, name: str, t) -> None:
    """A tensor argument must be dense (torch.strided, not nested), checked before its shape (a
    nested tensor has none). The exchanges and the operators read elements through strides: a
    sparse or MKL-DNN tensor of the right shape and dtype once passed every other check and failed
    after the agreement exchange on its own rank alone (its peers waited in the rows' exchange, or
    went on with a result while it raised); a nested one raised from its shape before the exchange,
    on its own rank alone."""
    if isinstance(t, torch.Tensor) and (t.is_nested or t.layout != torch.strided):
        kind = "a nested tensor" if t.is_nested else f"a {t.layout} tensor"
        raise ValueError(f"{op}: {name} must be a dense tensor (torch.strided layout), got {kind}")


def dispatch(x: torch.Tensor, expert_idx: torch.Tensor, num_experts: int, *, group=None,
             expert_capacity: Optional[int] = None, numerics: str = "atlas_a2"):
    """Sends each (token, choice) pair's row of x to the rank that owns its expert.

    Rank r of W owns experts [r*E/W, (r+1)*E/W) (num_experts E divisible by W). Every rank of the
    group must call dispatch at the same time (with the same E, H, K, dtype, device type,
    expert_capacity and numerics: checked, a mismatch raises the same ValueError on every rank).

    Args:
        x: [N, H] float32/float16/bfloat16, this rank's tokens (N may be 0; N may differ by rank).
        expert_idx: [N, K] int32, each token's experts, values in [0, E).
        num_experts: E.
        group: the process group (None: the default one; a world of one without torch.distributed).
        expert_capacity: None (dropless) or C >= 1: expert e keeps its first C pairs in the global
            order (source rank, source token, choice), as single-device drop-pad does.
        numerics: "atlas_a2" or "ascend_950", the order of x's gradient (moe_init_routing_grad).

    Returns:
        (recv_x, tokens_per_local_expert, handle):
        recv_x: this rank's expert rows, expert-major, within an expert ordered by (source rank,
            source token, choice): [M, H] dropless (concatenated over ranks: the single-device
            expanded_x of the global batch), or [E/W, C, H] with a capacity (unfilled slots zero;
            concatenated over ranks: the single-device drop-pad expanded_x [E, C, H]).
        tokens_per_local_expert: int64 [E/W] on the CPU, the rows of each local expert (after capacity).
        handle: a DispatchHandle for `combine`.
        Differentiable with respect to x (the same bits as the single-device backward).

    Raises:
        ValueError: bad arguments on any rank, or ranks that disagree (the same error on every rank).
        RuntimeError: a collective failed or timed out (naming the operation and the rank).
    """
    comm = Comm(group, "dispatch")
    error = None
    experts, capacity, routing = -1, None, None
    try:
        experts, capacity = _dispatch_checks(x, expert_idx, num_experts, expert_capacity, numerics, comm.world)
        routing = _LocalRouting(expert_idx, experts, comm.world)
    except (ValueError, IndexError, RuntimeError) as failure:
        error = str(failure)
    ok = error is None
    fields = {6: experts if ok else -1,
              7: x.shape[1] if ok else -1,
              8: expert_idx.shape[1] if ok else -1,
              9: _DTYPE_CODES.get(x.dtype, -1) if ok else -1,
              10: -1 if capacity is None else capacity,
              11: _NUMERICS_CODES[numerics] if ok else -1,
              12: int(ok and torch.is_grad_enabled() and x.requires_grad),
              _F_DEVICE: _device_code(x) if ok else 0}
    payload = torch.cat([routing.counts, routing.token_splits]).cpu() if ok else None
    table = _exchange("dispatch", comm, fields, error, x.shape[0] if ok else 0, payload)
    everything = _gather_payload(table, payload, experts + comm.world, comm)
    handle = _plan(comm, x, expert_idx, routing, everything[:, :experts], everything[:, experts:], capacity,
                   numerics)
    handle.tokens_per_rank = table[:, _F_TOKENS].tolist()
    handle.serial = _DISPATCHES[comm.name()] = _DISPATCHES.get(comm.name(), 0) + 1
    recv_x = _Dispatch.apply(x, _exchange_tokens(comm, x, expert_idx, handle), handle)
    return recv_x, handle.tokens_per_local_expert, handle


class _LocalRouting:
    """This rank's pairs sorted by expert (moe_init_routing's order: stable by (expert, p)), and
    the tokens each rank must receive: those with at least one pair among its experts, in
    increasing token order (sent once, whatever their number of pairs there)."""

    def __init__(self, expert_idx: torch.Tensor, experts: int, world: int):
        n, k = expert_idx.shape
        device = expert_idx.device
        flat = expert_idx.reshape(-1).long()
        self.order = torch.argsort(flat, stable=True)  # row d of the sorted pairs holds pair order[d]
        self.expanded_row_idx = torch.empty(n * k, dtype=torch.int32, device=device)
        self.expanded_row_idx[self.order] = torch.arange(n * k, dtype=torch.int32, device=device)
        self.counts = torch.bincount(flat, minlength=experts).cpu()
        self.owner = torch.div(flat, experts // world, rounding_mode="floor")  # each pair's rank
        needed = torch.zeros(world, n, dtype=torch.bool, device=device)
        needed[self.owner, torch.arange(n * k, device=device) // k] = True
        self.token_splits = needed.sum(1).cpu()
        self.sent_tokens = needed.nonzero()[:, 1]  # rank-major, increasing token within a rank
        # Where (rank, token) sits among the sent tokens (-1: not sent).
        self.position = torch.full((world, n), -1, dtype=torch.int64, device=device)
        self.position[needed] = torch.arange(self.sent_tokens.numel(), device=device)


def _gather_payload(table: torch.Tensor, payload: torch.Tensor, words: int, comm: Comm) -> torch.Tensor:
    """[W, words]: every rank's payload (the first message's part, then further messages)."""
    start = _HEADER_WORDS + _TEXT_WORDS
    first = min(words, _PAYLOAD_WORDS)
    pieces = [table[:, start:start + first]]
    done = first
    while done < words:  # only for E + W > _PAYLOAD_WORDS; every rank agrees on E and W by now
        chunk = payload[done:done + _MESSAGE_WORDS]
        message = torch.zeros(_MESSAGE_WORDS, dtype=torch.int64)
        message[:chunk.numel()] = chunk
        more = comm.all_gather_fixed(message.to(comm.meta_device()), "counts exchange (all_gather)").cpu()
        pieces.append(more[:, :chunk.numel()])
        done += chunk.numel()
    return torch.cat(pieces, dim=1)


def _segments(lengths: torch.Tensor, starts: torch.Tensor, total: int, device) -> torch.Tensor:
    """int64 [total]: for each segment i (in order) the run starts[i], starts[i]+1, ...,
    starts[i]+lengths[i]-1."""
    if total == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    lengths_d = lengths.to(device)
    first = torch.cumsum(lengths, 0) - lengths
    shift = torch.repeat_interleave((starts - first).to(device), lengths_d, output_size=total)
    return shift + torch.arange(total, device=device)


def _plan(comm: Comm, x, expert_idx, routing: _LocalRouting, counts: torch.Tensor, token_splits: torch.Tensor,
          capacity: Optional[int], numerics: str) -> DispatchHandle:
    """Every index the exchanges need. counts [W, E]: every rank's pairs per expert;
    token_splits [W, W]: tokens rank s sends rank d."""
    world, rank = comm.world, comm.rank
    local = counts.shape[1] // world
    experts = counts.shape[1]
    n, k = expert_idx.shape
    hidden = x.shape[1]
    device = x.device
    if capacity is None:
        keep = counts
    else:
        before = torch.cumsum(counts, 0) - counts
        keep = torch.minimum((capacity - before).clamp(min=0), counts)
    h = DispatchHandle()
    h.comm = comm
    h.num_experts, h.local_experts, h.first_expert = experts, local, rank * local
    h.top_k, h.hidden, h.dtype = k, hidden, x.dtype
    h.expert_capacity, h.numerics, h.num_tokens = capacity, numerics, n
    # A copy: combine reads it (bias rows) after the caller may have changed its own tensor in
    # place, and the backward uses the copies taken here.
    h.expert_idx = expert_idx.clone()
    h.counts = counts
    mine = keep[:, rank * local:(rank + 1) * local]  # [W, E/W] pairs I receive, per source and expert
    h.tokens_per_local_expert = mine.sum(0)
    # Pair rows (the combine forward, the dispatch backward): kept pairs, per destination.
    h.send_splits = keep[rank].view(world, local).sum(1).tolist()
    h.recv_splits = mine.sum(1).tolist()
    # Token rows (the dispatch forward, the combine backward): a token once per destination.
    h.token_send_splits = token_splits[rank].tolist()
    h.token_recv_splits = token_splits[:, rank].tolist()
    h.sent_tokens = routing.sent_tokens

    # Token side: this rank's kept pairs in send order (destination, expert, token, choice).
    pairs = n * k
    kept = int(keep[rank].sum())
    mine_counts = counts[rank]
    kept_rows = _segments(keep[rank], torch.cumsum(mine_counts, 0) - mine_counts, kept, device)
    position = torch.full((pairs,), -1, dtype=torch.int64, device=device)
    position[kept_rows] = torch.arange(kept, device=device)
    h.local_index = position[routing.expanded_row_idx.long()].to(torch.int32)
    h.kept_pairs = routing.order[kept_rows]
    # Where each kept pair's grad_scales comes back: row (destination, token) of the sent tokens.
    kept_tokens = torch.div(h.kept_pairs, k, rounding_mode="floor")
    h.scales_back = routing.position[routing.owner[h.kept_pairs], kept_tokens] * k + h.kept_pairs % k

    # Owner side. Received pairs are numbered source-major, then local expert, then (token,
    # choice): m. owner_index[m] is its row (dropless) or slot (capacity) of recv_x.
    received = int(mine.sum())
    block_len = mine.reshape(-1)
    before_source = torch.cumsum(mine, 0) - mine
    if capacity is None:
        totals = mine.sum(0)
        base = torch.cumsum(totals, 0) - totals
        h.recv_shape = (received, hidden)
    else:
        base = torch.arange(local, dtype=torch.int64) * capacity
        h.recv_shape = (local, capacity, hidden)
    h.owner_index = _segments(block_len, (base.unsqueeze(0) + before_source).reshape(-1), received, device)
    slots = received if capacity is None else local * capacity
    owner_gather = torch.full((slots,), received, dtype=torch.int64, device=device)
    owner_gather[h.owner_index] = torch.arange(received, device=device)
    h.owner_gather = owner_gather

    h.owner_block_len = block_len
    return h


def _exchange_tokens(comm: Comm, x: torch.Tensor, expert_idx: torch.Tensor, h: DispatchHandle) -> torch.Tensor:
    """Sends each needed token's row with its K expert ids appended (one all-to-all: the ids are
    what the owner needs to find its pairs) and completes the owner's indices from the ids that
    arrive. Returns the received rows [received tokens + 1, H] (a strided view of a staging
    buffer; the last row zero, for unfilled capacity slots)."""
    dtype, device = x.dtype, x.device
    k, hidden = h.top_k, h.hidden
    row_bytes = -(-hidden * dtype.itemsize // 8) * 8  # the ids start 8-byte aligned
    width = row_bytes + -(-4 * k // 8) * 8
    sent = h.sent_tokens.numel()
    send = staging(0, (sent, width), torch.uint8, device)
    torch.index_select(x.detach(), 0, h.sent_tokens, out=send[:, :row_bytes].view(dtype)[:, :hidden])
    send[:, row_bytes:row_bytes + 4 * k].view(torch.int32).copy_(expert_idx.index_select(0, h.sent_tokens))
    tokens_in = sum(h.token_recv_splits)
    recv = staging(1, (tokens_in + 1, width), torch.uint8, device)
    recv[tokens_in].zero_()
    comm.all_to_all_rows(send, h.token_recv_splits, h.token_send_splits, "token rows exchange (all_to_all)",
                         out=recv[:tokens_in])
    ids = recv[:tokens_in, row_bytes:row_bytes + 4 * k].contiguous().view(torch.int32)
    _owner_pairs(h, ids)
    return recv[:, :row_bytes].view(dtype)[:, :hidden]


def _owner_pairs(h: DispatchHandle, ids: torch.Tensor) -> None:
    """From the received tokens' expert ids: which (token, choice) is received pair m (this rank's
    expert, kept: the first of each (source, expert) up to its kept count)."""
    comm, k, local = h.comm, h.top_k, h.local_experts
    device = ids.device
    tokens_in = ids.shape[0]
    h.received_tokens = tokens_in
    flat = ids.reshape(-1).long()
    source = torch.repeat_interleave(torch.arange(comm.world, device=device),
                                     torch.tensor(h.token_recv_splits, device=device), output_size=tokens_in)
    is_mine = (flat >= h.first_expert) & (flat < h.first_expert + local)
    others = comm.world * local
    group = torch.where(is_mine, source.repeat_interleave(k) * local + flat - h.first_expert, others)
    order = torch.argsort(group, stable=True)  # (source, expert, token, choice); other ranks' last
    sorted_group = group[order]
    group_size = torch.bincount(group, minlength=others + 1)
    group_start = torch.cumsum(group_size, 0) - group_size
    rank_in_group = torch.arange(order.numel(), device=device) - group_start[sorted_group]
    room = torch.cat([h.owner_block_len, torch.zeros(1, dtype=torch.int64)]).to(device)
    pair_of_m = order[rank_in_group < room[sorted_group]]  # the (token, choice) of received pair m
    # recv_x row r copies received token row expand[r]; an unfilled capacity slot the zero row.
    token_of_m = torch.cat([torch.div(pair_of_m, k, rounding_mode="floor"),
                            torch.full((1,), tokens_in, dtype=torch.int64, device=device)])
    h.expand = token_of_m[h.owner_gather]
    # The combine backward's index on the received tokens: (token, choice) -> recv_x row or slot,
    # -1 for other ranks' experts and dropped pairs; and the local expert ids (0 where -1).
    h.owner_pair_index = torch.full((tokens_in * k,), -1, dtype=torch.int32, device=device)
    h.owner_pair_index[pair_of_m] = h.owner_index.to(torch.int32)
    h.owner_pair_experts = torch.where(is_mine, flat - h.first_expert, 0).to(torch.int32).view(tokens_in, k)


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, received_tokens, h: DispatchHandle):
        ctx.handle = h
        # recv_x is handed to the experts and freed a step later: from the output cache, as the
        # operators' outputs (new pages would cost their first touch on every step).
        rows = _cache.empty((h.expand.shape[0], received_tokens.shape[1]), received_tokens.dtype,
                            received_tokens.device)
        return torch.index_select(received_tokens, 0, h.expand, out=rows).view(h.recv_shape)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return _DispatchGrad.apply(grad, ctx.handle), None, None


class _DispatchGrad(torch.autograd.Function):
    """The dispatch's backward as a function of its own, whose backward is the dispatch's forward
    again (rows only move): create_graph=True and second derivatives through dispatch work, as
    through the single-device moe_init_routing."""

    @staticmethod
    def forward(ctx, grad, h: DispatchHandle):
        ctx.handle = h
        grad = grad.contiguous().view(-1, h.hidden)
        send = torch.index_select(grad, 0, h.owner_index,
                                  out=staging(0, (h.received_rows, h.hidden), grad.dtype, grad.device))
        rows = h.comm.all_to_all_rows(send, h.send_splits, h.recv_splits, "rows exchange backward (all_to_all)",
                                      out=staging(1, (h.kept_rows_count, h.hidden), grad.dtype, grad.device))
        if h.expert_capacity is None:
            return _init_routing_grad(rows, h.local_index, h.top_k, 0, 0, numerics=h.numerics)
        # The single-device drop-pad backward (mode 1, -1 skipped) on the rows this rank kept,
        # viewed as one expert of capacity R (a scratch row when none was kept).
        kept = rows.shape[0]
        block = rows.view(1, kept, h.hidden) if kept else rows.new_zeros((1, 1, h.hidden))
        return _init_routing_grad(block, h.local_index, h.top_k, 1, 0, numerics=h.numerics)

    @staticmethod
    def backward(ctx, grad_grad):
        h: DispatchHandle = ctx.handle
        step = "token rows exchange, second derivative (all_to_all)"
        received, work = _send_token_rows(h.comm, grad_grad, h, step, spare_row=True)
        h.comm.wait(step, work)
        return _Dispatch.apply(grad_grad, received, h), None


def _send_token_rows(comm: Comm, rows: torch.Tensor, h: DispatchHandle, step: str, *, spare_row: bool = False):
    """rows [N, H] (this rank's tokens): each needed token's row once to each rank owning one of
    its experts, asynchronously. Returns (received [received tokens (+1 zero row with spare_row),
    H], a staging buffer; the work to wait for)."""
    dtype, device = rows.dtype, rows.device
    send = torch.index_select(rows, 0, h.sent_tokens,
                              out=staging(0, (h.sent_tokens.numel(), h.hidden), dtype, device))
    received = staging(1, (h.received_tokens + int(spare_row), h.hidden), dtype, device)
    if spare_row:
        received[h.received_tokens].zero_()
    _, work = comm.all_to_all_rows(send, h.token_recv_splits, h.token_send_splits, step, async_op=True,
                                   out=received[:h.received_tokens])
    return received, work


# ---- combine ----------------------------------------------------------------------------------------

def _combine_checks(expert_out, h, scales, x1, x2, bias, numerics) -> None:
    op = "moe_routing.distributed.combine"
    for name, t in (("expert_out", expert_out), ("scales", scales), ("x1", x1), ("x2", x2), ("bias", bias)):
        _check_dense(op, name, t)
    shape = list(h.recv_shape)
    if (not isinstance(expert_out, torch.Tensor) or list(expert_out.shape) != shape
            or expert_out.dtype != h.dtype):
        raise ValueError(f"{op}: expert_out must be {dtype_name(h.dtype)} {shape} (the shape and "
                         f"dtype of dispatch's recv_x), got {_describe(expert_out)}")
    device = h.local_index.device
    n, k, hidden = h.num_tokens, h.top_k, h.hidden
    if expert_out.device != device:
        raise ValueError(f"{op}: expert_out must be on the device of dispatch's x ({device}), got {expert_out.device}")
    if scales is not None:
        mixed = h.dtype == torch.bfloat16 and isinstance(scales, torch.Tensor) and scales.dtype == torch.float32
        if (not isinstance(scales, torch.Tensor) or list(scales.shape) != [n, k]
                or (scales.dtype != h.dtype and not mixed) or scales.device != device):
            allowed = dtype_name(h.dtype) + (" or float32" if h.dtype == torch.bfloat16 else "")
            raise ValueError(f"{op}: scales must be {allowed} [N, K] = [{n}, {k}] on {device}, got "
                             f"{_describe(scales)}")
    for name, t in (("x1", x1), ("x2", x2)):
        if t is not None and (not isinstance(t, torch.Tensor) or list(t.shape) != [n, hidden]
                              or t.dtype != h.dtype or t.device != device):
            raise ValueError(f"{op}: {name} must be {dtype_name(h.dtype)} [N, H] = [{n}, {hidden}] "
                             f"on {device}, got {_describe(t)}")
    if x2 is not None and x1 is None:
        raise ValueError(f"{op}: x2 needs x1, got x2 without x1")
    if bias is not None and (not isinstance(bias, torch.Tensor) or list(bias.shape) != [h.num_experts, hidden]
                             or bias.dtype != h.dtype or bias.device != device):
        raise ValueError(f"{op}: bias must be {dtype_name(h.dtype)} [E, H] = [{h.num_experts}, "
                         f"{hidden}] on {device}, got {_describe(bias)}")
    _check_numerics(op, numerics)


def _requires_grad(t) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled()


def combine(expert_out: torch.Tensor, handle: DispatchHandle, *, scales: Optional[torch.Tensor] = None,
            x1: Optional[torch.Tensor] = None, x2: Optional[torch.Tensor] = None,
            bias: Optional[torch.Tensor] = None, numerics: str = "atlas_a2") -> torch.Tensor:
    """Returns the experts' rows to their tokens' ranks and combines them there:
    y[i] = x1[i] + x2[i] + sum_t scales[i, t] * (row(i, t) + bias[expert_idx[i, t]]),
    moe_finalize_routing of the token's pairs in the single-device order. Every rank of the group
    must call combine at the same time with its handle from the same dispatch.

    Args:
        expert_out: the experts' outputs in recv_x's layout and dtype ([M, H] or [E/W, C, H]).
        handle: dispatch's handle.
        scales: optional [N, K] (this rank's tokens), dtype of x (or float32 with bfloat16).
        x1, x2: optional [N, H] (shared expert / residual), dtype of x; x2 needs x1.
        bias: optional [E, H] (every expert), dtype of x, the same on every rank. Its gradient
            is the global batch's on every rank (already summed over ranks: do not average it
            again, e.g. keep it out of DDP).
        numerics: "atlas_a2" or "ascend_950" (moe_finalize_routing's numerics, forward and backward).

    Returns:
        y [N, H], dtype of x, on this rank. Differentiable with respect to expert_out, scales, x1,
        x2 and bias (the same bits as the single-device backward of the global batch). Dropped
        pairs (capacity) add nothing, as single-device drop-pad.

    Raises:
        TypeError: handle is not a handle dispatch returned (on this rank alone, before any
            collective: the other ranks time out in the agreement exchange).
        ValueError: bad arguments on any rank, or ranks that disagree (the same error on every rank).
        RuntimeError: a collective failed or timed out (naming the operation and the rank).
    """
    # The handle names the group to agree on, so it is checked here, on this rank alone, before any
    # collective (the default group's exchange once left a subgroup's peers waiting in theirs, and
    # this rank in its own): the peers then time out in the agreement exchange.
    if not isinstance(handle, DispatchHandle) or not handle.serial:
        got = type(handle).__name__ + (" (not made by dispatch)" if isinstance(handle, DispatchHandle) else "")
        raise TypeError(f"moe_routing.distributed.combine: handle must be the handle returned by dispatch, got {got}")
    comm = handle.comm.renamed("combine")
    error = None
    try:
        _combine_checks(expert_out, handle, scales, x1, x2, bias, numerics)
    except ValueError as failure:
        error = str(failure)
    ok = error is None
    # What decides whether the backward runs _CombineGrad's collectives (x1's and x2's flags do not).
    needs = (_requires_grad(expert_out), _requires_grad(scales), _requires_grad(bias))
    fields = {}
    if ok:
        fields = {6: handle.num_experts, 7: handle.hidden, 8: handle.top_k, 9: _DTYPE_CODES[expert_out.dtype],
                  10: -1 if handle.expert_capacity is None else handle.expert_capacity,
                  11: _NUMERICS_CODES[numerics], 12: 0 if scales is None else _DTYPE_CODES[scales.dtype],
                  13: int(bias is not None), 14: int(needs[0]), 15: int(needs[1]), 16: int(needs[2]),
                  17: handle.serial, _F_DEVICE: _device_code(expert_out)}
    _exchange("combine", comm, fields, error, handle.num_tokens if ok else 0, None)
    return _Combine.apply(expert_out, scales, x1, x2, bias, handle, comm, numerics, needs)


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, expert_out, scales, x1, x2, bias, h: DispatchHandle, comm: Comm, numerics: str, needs):
        ctx.handle, ctx.comm, ctx.numerics, ctx.needs = h, comm, numerics, needs
        rows_out = expert_out.contiguous().view(-1, h.hidden)
        dtype, device = rows_out.dtype, rows_out.device
        send = torch.index_select(rows_out, 0, h.owner_index,
                                  out=staging(0, (h.received_rows, h.hidden), dtype, device))
        rows = comm.all_to_all_rows(send, h.send_splits, h.recv_splits, "rows exchange (all_to_all)",
                                    out=staging(1, (h.kept_rows_count, h.hidden), dtype, device))
        y = _finalize(rows, h.local_index, x1, x2, bias, scales, h.expert_idx, None, None, None, None, 2, None, None,
                      None, h.top_k, numerics=numerics, api="v2")
        # expert_out is read only by scales' gradient: kept only then, as the single-device
        # operators' autograd keeps it (changed in place after the combine, it made a backward that
        # never reads it refuse it, and it stayed alive until the backward).
        ctx.save_for_backward(expert_out if needs[1] else None, scales, bias)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        expert_out, scales, bias = ctx.saved_tensors
        grads = [None] * 9
        grad_y = grad_y.contiguous()
        if ctx.needs_input_grad[2]:
            grads[2] = grad_y
        if ctx.needs_input_grad[3]:
            grads[3] = grad_y
        if any(ctx.needs):
            grads[0], grads[1], grads[4] = _CombineGrad.apply(grad_y, expert_out, scales, bias, ctx.handle, ctx.comm,
                                                              ctx.numerics, ctx.needs)
        return tuple(grads)


class _CombineGrad(torch.autograd.Function):
    """The combine's backward (expert_out's, scales' and bias' gradients) as a function of its own
    whose backward raises, as the single-device moe_finalize_routing_grad's: create_graph=True gets
    the gradients, a second derivative a clear error (not one missing the saved tensors' terms)."""

    @staticmethod
    def forward(ctx, grad_y, expert_out, scales, bias, h: DispatchHandle, comm: Comm, numerics: str, needs):
        need_rows, need_scales, need_bias = needs
        # Each token's grad_y row (and its K scales) once to each rank owning one of its experts.
        step = "gradient rows exchange (all_to_all)"
        token_rows, rows_work = _send_token_rows(comm, grad_y, h, step)
        token_scales = None
        if scales is not None:
            token_scales, scales_work = comm.all_to_all_rows(
                scales.index_select(0, h.sent_tokens), h.token_recv_splits, h.token_send_splits,
                "scales exchange (all_to_all)", async_op=True)
            comm.wait("scales exchange (all_to_all)", scales_work)
        comm.wait(step, rows_work)
        local_bias = None
        if bias is not None and (need_bias or need_scales):
            local_bias = bias[h.first_expert:h.first_expert + h.local_experts].contiguous()
        grad_rows, grad_token_scales, grad_local_bias = _owner_grad(
            h, token_rows, token_scales, expert_out, local_bias, need_scales, need_bias, numerics)
        grads = [None] * 3
        if need_rows:
            grads[0] = grad_rows.view(h.recv_shape)  # expert_out's shape (checked by combine)
        if need_scales:
            back = comm.all_to_all_rows(grad_token_scales, h.token_send_splits, h.token_recv_splits,
                                        "grad_scales exchange (all_to_all)")
            grad_scales = torch.zeros(h.num_tokens * h.top_k, dtype=scales.dtype, device=scales.device)
            grad_scales[h.kept_pairs] = back.view(-1)[h.scales_back]
            grads[1] = grad_scales.view(h.num_tokens, h.top_k)
        if need_bias:
            grads[2] = comm.all_gather_rows(grad_local_bias, [h.local_experts] * comm.world,
                                            "grad_bias exchange (all_gather)")
        return tuple(grads)

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("moe_routing.distributed.combine: backward is not implemented (a second derivative "
                                  "of combine); differentiate it once, or detach its gradients")


def _owner_grad(h: DispatchHandle, token_rows, token_scales, expert_out, local_bias, need_scales, need_bias,
                numerics):
    """moe_finalize_routing_grad on the owner over the received tokens, their pairs of other
    ranks' experts and dropped pairs -1: the gradient rows in recv_x's layout, every received
    (token, choice)'s grad_scales (0 where -1), the local experts' grad_bias."""
    tokens, k = token_rows.shape[0], h.top_k
    received = h.received_rows
    scales_dtype = token_scales.dtype if token_scales is not None else token_rows.dtype
    if received == 0:  # no pair: zero rows, zero grad_scales, a zero bias gradient (+0 for no pair)
        zeros_bias = token_rows.new_zeros((h.local_experts, h.hidden)) if need_bias else None
        return token_rows.new_zeros(h.recv_shape), token_rows.new_zeros((tokens, k), dtype=scales_dtype), zeros_bias
    if h.expert_capacity is None:
        # Dropless: grad_expanded_x has `received` rows (active_num, when fewer than tokens*K).
        mode, active, experts, slots = 0, received if received < tokens * k else 0, 0, 0
    else:
        mode, active, experts, slots = 1, 0, h.local_experts, h.expert_capacity
    grad_rows, grad_scales, grad_bias = _finalize_grad(
        token_rows, h.owner_pair_index, expert_out.contiguous() if need_scales else None, token_scales,
        h.owner_pair_experts if local_bias is not None else None, local_bias, mode, active, experts, slots,
        numerics=numerics, compute_grad_scales=need_scales, compute_grad_bias=need_bias)
    return grad_rows, grad_scales, grad_bias
