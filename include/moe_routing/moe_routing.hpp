// The whole C++ API of moe_routing.
#pragma once

#include "moe_routing/dtype.h"
#include "moe_routing/moe_finalize_routing.h"
#include "moe_routing/moe_init_routing.h"
#include "moe_routing/moe_init_routing_grad.h"
#include "moe_routing/numerics.h"
#include "moe_routing/status.h"
#include "moe_routing/tensor.h"
