"""moe_routing: CANN's MoE token routing operators, bit-exact, for PyTorch.

    import moe_routing
    expanded_x, expanded_row_idx, counts, _, _ = moe_routing.moe_init_routing(
        x, expert_idx, expert_num=E, expert_tokens_num_flag=True)
    grad_x = moe_routing.moe_init_routing_grad(grad_expanded_x, expanded_row_idx, top_k)
    # ... the experts turn expanded_x into expanded_y; the combine weights and sums it per token:
    out = moe_routing.moe_finalize_routing(expanded_y, expanded_row_idx, x1=residual,
                                           scales=topk_weight, drop_pad_mode=2)

See docs/python.md for the API reference and the autograd support table.
"""
from __future__ import annotations

from . import _library  # noqa: F401  (registers torch.ops.moe_routing.*)
from . import _fake  # noqa: F401
from . import _autograd  # noqa: F401
from ._api import (moe_finalize_routing, moe_finalize_routing_grad, moe_init_routing, moe_init_routing_grad,
                   moe_init_routing_v2)
from . import ops
from ._cache import empty_cache, output_cache_stats, set_huge_pages, set_output_cache_limit

__version__ = "0.1.0"

__all__ = ["moe_init_routing", "moe_init_routing_grad", "moe_init_routing_v2", "moe_finalize_routing",
           "moe_finalize_routing_grad", "ops", "empty_cache", "output_cache_stats", "set_output_cache_limit",
           "set_huge_pages", "__version__"]
