// Quantized weights: the operators themselves (torch.ops.specswap.ggml_*)
// register with the dispatcher; here are ggml's loader and switches. ggml is
// loaded at run time, so a build without it still imports.
#include "python/bindings.h"

#ifdef SPECSWAP_WITH_GGML
#include "quant/ggml_api.h"
#endif

namespace py = pybind11;

namespace specswap::python {

void bind_quant(py::module_& m) {
#ifdef SPECSWAP_WITH_GGML
  m.attr("with_ggml") = true;
  m.def("ggml_load", &quant::ggml_load, py::arg("library_dir"),
        "Load libggml-base.so and libggml-cpu.so from this folder (once).");
  m.def("ggml_loaded", &quant::ggml_loaded);
  m.def("ggml_row_bytes", &quant::ggml_row_bytes, py::arg("weight_type"), py::arg("in_features"));
  m.def("ggml_set_fast_kernels", &quant::set_fast_kernels, py::arg("enabled"),
        "Multi-row Q8_0/Q5_0/Q4_0/Q4_K/Q6_K kernels on (default where AVX2 exists) or off; returns the previous.");
  m.def("ggml_fast_kernels_available", &quant::fast_kernels_available);
  m.def("ggml_set_vnni", &quant::set_vnni, py::arg("enabled"),
        "The AVX-512 VNNI variant of the Q8_0-family kernels on (default where it exists) or off; same bits.");
  m.def("ggml_vnni_available", &quant::vnni_available);
#else
  m.attr("with_ggml") = false;
#endif
}

}  // namespace specswap::python
