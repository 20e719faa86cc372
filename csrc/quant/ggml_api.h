// The part of ggml's C API the quantized linear calls, resolved at run time from the libggml-python package's
// libraries (ggml_load): the extension neither links nor needs ggml to import.
#pragma once

#include <ggml-cpu.h>
#include <ggml.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace specswap::quant {

struct GgmlApi {
  bool loaded = false;
  size_t (*row_size)(ggml_type, int64_t) = nullptr;
  int64_t (*blck_size)(ggml_type) = nullptr;
  const char* (*type_name)(ggml_type) = nullptr;
  const ggml_type_traits* (*traits)(ggml_type) = nullptr;
  size_t (*quantize_chunk)(ggml_type, const float*, void*, int64_t, int64_t, int64_t, const float*) = nullptr;
  void (*cpu_init)() = nullptr;
  const ggml_type_traits_cpu* (*traits_cpu)(ggml_type) = nullptr;
};

// Loads libggml-base.so and libggml-cpu.so from `library_dir` once; throws with the path and dlerror on failure.
bool ggml_load(const std::string& library_dir);
bool ggml_loaded();
// Our multi-row kernels for Q8_0 / Q5_0 / Q4_0 / Q4_1 / Q4_K / Q6_K weights (q8_kernels.h): on by default where the CPU has AVX2;
// off sends every type through ggml's one-row vec_dot. Returns the previous setting.
bool set_fast_kernels(bool enabled);
bool fast_kernels_available();
// The VNNI variant of the Q8_0-family kernels (same bits): off as a CPU without it would run; returns the previous.
bool set_vnni(bool enabled);
bool vnni_available();
// Bytes of one row of `in_features` values in ggml type `weight_type` (errors name an unsupported type).
int64_t ggml_row_bytes(int64_t weight_type, int64_t in_features);

}  // namespace specswap::quant
