// The module specswap._C: one section per domain (bind_core.cpp,
// bind_graphs.cpp, bind_quant.cpp).
#include "python/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "specswap C++ core: state pool, atomic tier switch, adaptive policy";
  specswap::python::bind_core(m);
  specswap::python::bind_graphs(m);
  specswap::python::bind_quant(m);
}
