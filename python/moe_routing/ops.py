"""Drop-in names for code written against cann_ops_transformer.ops:

    from moe_routing.ops import moe_init_routing, moe_init_routing_grad
"""
from ._api import moe_init_routing, moe_init_routing_grad, moe_init_routing_v2

__all__ = ["moe_init_routing", "moe_init_routing_grad", "moe_init_routing_v2"]
