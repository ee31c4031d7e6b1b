"""Drop-in names for code written against cann_ops_transformer.ops:

    from moe_routing.ops import moe_init_routing, moe_init_routing_grad
    from moe_routing.ops import moe_finalize_routing, moe_finalize_routing_grad

The functions take CANN's arguments in CANN's order, positionally or by keyword, with CANN's
defaults; ours (numerics, order, api, grad_bias, out) are keyword-only after them (docs/python.md).
moe_init_routing_v2 is not a name of CANN's extension: it is ours, with aclnnMoeInitRoutingV2's
parameters (docs/porting.md, section 2).
"""
from ._api import (moe_finalize_routing, moe_finalize_routing_grad, moe_init_routing, moe_init_routing_grad,
                   moe_init_routing_v2)

__all__ = ["moe_init_routing", "moe_init_routing_grad", "moe_init_routing_v2", "moe_finalize_routing",
           "moe_finalize_routing_grad"]
