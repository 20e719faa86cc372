// specswap._C is assembled from one binding function per domain; bindings.cpp
// calls them in this order.
#pragma once

#include <torch/extension.h>

namespace specswap::python {

// State pool, runtime states, AdaptiveConfig (from its field table), the policy.
void bind_core(pybind11::module_& m);
// GraphPool, GraphRunner, capture count, compiled backends.
void bind_graphs(pybind11::module_& m);
// The ggml_* helpers (torch.ops.specswap.ggml_* register themselves) and with_ggml.
void bind_quant(pybind11::module_& m);

}  // namespace specswap::python
