// Quantized weights: the operators themselves (torch.ops.specswap.ggml_*)
// register with the dispatcher; here are ggml's loader and switches, and simd_math's. ggml is
// loaded at run time, so a build without it still imports.
#include "python/bindings.h"

#include <ATen/Parallel.h>

#include <atomic>

#include "cpu_ops/simd_math.h"

#ifdef SPECSWAP_WITH_GGML
#include "quant/ggml_api.h"
#endif

namespace py = pybind11;

namespace specswap::python {
namespace {

// How many of torch's intra-op threads one at::parallel_for of this extension runs on. at::parallel_for is a
// header template: compiled without OpenMP it runs serially whatever torch.set_num_threads says, so this is
// the check that the build's threading is torch's.
int64_t parallel_threads_used(int64_t tasks) {
  std::atomic<uint64_t> seen{0};
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    volatile double sink = 0;  // enough work per task that every thread takes some
    for (int64_t i = begin; i < end; ++i)
      for (int j = 0; j < 200000; ++j) sink = sink + j;
    seen.fetch_or(uint64_t{1} << (at::get_thread_num() % 64));
  });
  return __builtin_popcountll(seen.load());
}

}  // namespace

void bind_quant(py::module_& m) {
  m.def("parallel_threads_used", &parallel_threads_used, py::arg("tasks"),
        "Distinct intra-op threads one at::parallel_for over `tasks` tasks ran on (a build check).");
  m.def("simd_math_set", &cpu_ops::simd_math::set_simd, py::arg("enabled"),
        "The AVX2 forms of invariant_attention and gated_activation on (default where AVX2 exists) or off; same "
        "bits. Returns the previous setting.");
#ifdef SPECSWAP_WITH_GGML
  m.attr("with_ggml") = true;
  m.def("ggml_load", &quant::ggml_load, py::arg("library_dir"),
        "Load libggml-base.so and libggml-cpu.so from this folder (once).");
  m.def("ggml_loaded", &quant::ggml_loaded);
  m.def("ggml_row_bytes", &quant::ggml_row_bytes, py::arg("weight_type"), py::arg("in_features"));
  m.def("ggml_set_fast_kernels", &quant::set_fast_kernels, py::arg("enabled"),
        "Multi-row Q8_0/Q5_0/Q4_0/Q4_1/Q4_K/Q6_K kernels on (default where AVX2 exists) or off; returns the previous.");
  m.def("ggml_fast_kernels_available", &quant::fast_kernels_available);
  m.def("ggml_set_vnni", &quant::set_vnni, py::arg("enabled"),
        "The AVX-512 VNNI variant of the Q8_0-family kernels on (default where it exists) or off; same bits.");
  m.def("ggml_vnni_available", &quant::vnni_available);
#else
  m.attr("with_ggml") = false;
#endif
}

}  // namespace specswap::python
