// Linear layers over weights kept in their GGUF block formats (Q4_0 ... Q6_K, F16, BF16), computed with
// ggml's CPU kernels. ggml is loaded at run time (dlopen, `ggml_load`), so the extension imports without it
// and a model that asks for quantized weights gets an error naming the extra that brings it.
//
//   ggml_linear(x [..., K] fp32|bf16, weight [N, row_bytes] uint8, type) -> [..., N] in x's dtype
//   ggml_embedding(weight [V, row_bytes] uint8, type, ids [...] int64, dtype) -> [..., K]
//   ggml_quantize(w [N, K] fp32, type) -> [N, row_bytes] uint8;  ggml_dequantize(weight, type, K) -> [N, K] fp32
//
// Batch invariance: every output element is one ggml vec_dot of one weight row with one activation row, and
// each activation row is quantized on its own, so a row's bits do not depend on how many rows are beside it
// (nor on the thread count: a whole dot is computed by one thread).
#include <dlfcn.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "quant/ggml_api.h"
#include "quant/q8_kernels.h"
#include "quant/x8_kernels.h"

namespace specswap::quant {
namespace {

GgmlApi g_api;
bool g_fast_kernels = true;  // off: every type through ggml's vec_dot (tests compare the two)
bool g_vnni = true;          // off: the Q8_0-family kernels use AVX2's integer dot even where VNNI exists
std::mutex g_load_mutex;

template <typename F>
void resolve(void* handle, const char* name, F*& out, const std::string& path) {
  out = reinterpret_cast<F*>(dlsym(handle, name));
  TORCH_CHECK(out != nullptr, "ggml library ", path, " has no symbol ", name, " (", dlerror(), ")");
}

// Types the quantized linear accepts: ggml has a CPU vec_dot for each and a from_float for its activation type.
constexpr int kSupportedTypes[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0,
                                   GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                                   GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                   GGML_TYPE_Q6_K};

// The interleaved layouts (x8_kernels.h): id, name, kind, and the ggml type whose rows they hold.
struct Layout {
  int64_t id;
  const char* name;
  X8Kind kind;
  ggml_type rows;
};
constexpr Layout kLayouts[] = {{kTypeQ8_0x8, "Q8_0x8", X8Kind::kQ8_0, GGML_TYPE_Q8_0},
                               {kTypeQ5_0x8, "Q5_0x8", X8Kind::kQ5_0, GGML_TYPE_Q5_0},
                               {kTypeQ4_1x8, "Q4_1x8", X8Kind::kQ4_1, GGML_TYPE_Q4_1},
                               {kTypeQ4_Kx8, "Q4_Kx8", X8Kind::kQ4_K, GGML_TYPE_Q4_K},
                               {kTypeQ6_Kx8, "Q6_Kx8", X8Kind::kQ6_K, GGML_TYPE_Q6_K}};

const Layout* layout_of(int64_t type) {
  for (const Layout& layout : kLayouts) {
    if (layout.id == type) return &layout;
  }
  return nullptr;
}

// the layout a plain type repacks to, or nullptr
const Layout* layout_for(ggml_type plain) {
  for (const Layout& layout : kLayouts) {
    if (layout.rows == plain) return &layout;
  }
  return nullptr;
}

bool supported(int64_t type) {
  return layout_of(type) != nullptr ||
         std::find(std::begin(kSupportedTypes), std::end(kSupportedTypes), type) != std::end(kSupportedTypes);
}

bool is_x8(ggml_type type) { return layout_of(type) != nullptr; }
X8Kind x8_kind(ggml_type type) { return layout_of(type)->kind; }

// the ggml type whose rows a type's rows hold (an interleaved layout: its file type's rows, rearranged)
ggml_type row_type(ggml_type type) { return is_x8(type) ? layout_of(type)->rows : type; }

const char* type_label(const GgmlApi& ggml, int64_t type) {
  if (const Layout* layout = layout_of(type)) return layout->name;
  return ggml.type_name(static_cast<ggml_type>(type));
}

std::string supported_names() {
  std::string names;
  for (int type : kSupportedTypes) {
    if (!names.empty()) names += ", ";
    names += g_api.loaded ? g_api.type_name(static_cast<ggml_type>(type)) : std::to_string(type);
  }
  for (const Layout& layout : kLayouts) names += std::string(", ") + layout.name + " (" + std::to_string(layout.id) + ")";
  return names + " (the last ones interleaved by ggml_repack)";
}

const GgmlApi& api() {
  TORCH_CHECK(g_api.loaded,
              "quantized (GGUF) weights need ggml's CPU library, which is not loaded: "
              "pip install \"specswap[ggml]\" (the libggml-python package), or load weights as bf16/fp32");
  return g_api;
}

ggml_type checked_type(int64_t type) {
  const GgmlApi& ggml = api();
  const bool known = (type >= 0 && type < GGML_TYPE_COUNT) || layout_of(type) != nullptr;
  TORCH_CHECK(known && supported(type), "ggml type ", type,
              known ? std::string(" (") + type_label(ggml, type) + ")" : std::string(),
              " is not supported by the quantized linear; supported: ", supported_names());
  return static_cast<ggml_type>(type);
}

void check_weight(const at::Tensor& weight, ggml_type type, int64_t in_features, const char* what) {
  const GgmlApi& ggml = api();
  TORCH_CHECK(weight.device().is_cpu(), what, ": weight must be on the CPU, got ", weight.device());
  TORCH_CHECK(weight.scalar_type() == at::kByte && weight.dim() == 2 && weight.is_contiguous(), what,
              ": weight must be a contiguous 2-D uint8 tensor of blocks [N, row_bytes], got ", weight.scalar_type(),
              " of shape ", weight.sizes());
  const ggml_type rows = row_type(type);
  const int64_t block = ggml.blck_size(rows);
  TORCH_CHECK(in_features > 0 && in_features % block == 0, what, ": in_features ", in_features,
              " is not a positive multiple of ", type_label(ggml, type), "'s block size ", block);
  const int64_t row_bytes = static_cast<int64_t>(ggml.row_size(rows, in_features));
  TORCH_CHECK(weight.size(1) == row_bytes, what, ": a ", type_label(ggml, type), " row of ", in_features,
              " values takes ", row_bytes, " bytes, but weight rows have ", weight.size(1));
  TORCH_CHECK(!is_x8(type) || weight.size(0) % kX8Rows == 0, what, ": ", type_label(ggml, type), " weights hold groups of ", kX8Rows,
              " rows, got ", weight.size(0), " rows");
}

// One row of blocks to fp32. ggml's type traits have no to_float for F32 (its rows already are fp32): calling
// the null pointer crashed ggml_dequantize and ggml_embedding on F32 weights.
void copy_f32_row(const void* src, float* dst, int64_t k) { std::memcpy(dst, src, k * sizeof(float)); }

ggml_to_float_t row_to_float(const GgmlApi& ggml, ggml_type type) {
  if (type == GGML_TYPE_F32) return &copy_f32_row;
  type = row_type(type);
  const ggml_to_float_t to_float = ggml.traits(type)->to_float;
  TORCH_CHECK(to_float != nullptr, "ggml has no dequantizer for ", ggml.type_name(type));
  return to_float;
}

// Reads one weight row as fp32 (interleaved rows are first gathered back into their file type's blocks).
class RowReader {
 public:
  RowReader(const GgmlApi& ggml, ggml_type type, const at::Tensor& weight, int64_t k)
      : to_float_(row_to_float(ggml, type)),
        row_bytes_(ggml.row_size(row_type(type), k)),
        weight_(weight.data_ptr<uint8_t>()),
        k_(k),
        x8_(is_x8(type)),
        kind_(is_x8(type) ? x8_kind(type) : X8Kind::kQ8_0) {}
  void operator()(int64_t row, float* dst) const;

 private:
  ggml_to_float_t to_float_;
  size_t row_bytes_;
  const uint8_t* weight_;
  int64_t k_;
  bool x8_;
  X8Kind kind_;
};

// Per-call scratch that grows once and is then reused: the hot path allocates nothing but its output.
struct Scratch {
  std::vector<float> rows;         // activation rows converted to fp32 (bf16 input)
  std::vector<uint8_t> quantized;  // activation rows in the weight type's vec_dot type
  std::vector<float> act_scales;   // their Q8_0 block scales as fp32 (the multi-row kernels)
  // the interleaved kernels' activations (X8Activations)
  std::vector<int8_t> act_values;
  std::vector<int32_t> act_sums;
  std::vector<float> act_mins;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

void RowReader::operator()(int64_t row, float* dst) const {
  if (!x8_) {
    to_float_(weight_ + row * row_bytes_, dst, k_);
    return;
  }
  thread_local std::vector<uint8_t> blocks;  // a row of the file type's blocks
  if (blocks.size() < row_bytes_) blocks.resize(row_bytes_);
  unpack_x8_row(kind_, weight_, row, k_ / x8_block_values(kind_), blocks.data());
  to_float_(blocks.data(), dst, k_);
}

// The multi-row kernel for a weight type, when one exists and this CPU runs it.
bool q8_kernel_for(ggml_type type, QWeight* kind) {
  static const bool cpu_ok = q8_kernels_supported();
  if (!cpu_ok || !g_fast_kernels) return false;
  switch (type) {
    case GGML_TYPE_Q8_0: *kind = QWeight::kQ8_0; return true;
    case GGML_TYPE_Q5_0: *kind = QWeight::kQ5_0; return true;
    case GGML_TYPE_Q4_0: *kind = QWeight::kQ4_0; return true;
    case GGML_TYPE_Q4_1: *kind = QWeight::kQ4_1; return true;
    case GGML_TYPE_Q4_K: *kind = QWeight::kQ4_K; return true;
    case GGML_TYPE_Q6_K: *kind = QWeight::kQ6_K; return true;
    default: return false;
  }
}

bool use_vnni() {
  static const bool cpu_ok = vnni_supported();
  return cpu_ok && g_vnni;
}

template <typename Out>
void run_linear(const GgmlApi& ggml, ggml_type type, const uint8_t* weight, int64_t n_out, int64_t k,
                const uint8_t* act, size_t act_row_bytes, int64_t m, Out* out) {
  const ggml_type_traits_cpu* traits = ggml.traits_cpu(type);
  const size_t w_row_bytes = ggml.row_size(type, k);
  QWeight kind;
  const bool multi_row = q8_kernel_for(type, &kind);
  const bool vnni = multi_row && use_vnni();
  const int64_t blocks = multi_row ? k / block_values(kind) : 0;
  const float* act_scales = nullptr;
  if (multi_row && !is_k_quant(kind)) {  // once per call, shared by every weight row
    std::vector<float>& scales = scratch().act_scales;
    const auto count = static_cast<size_t>(act_scale_count(kind, blocks, m));
    if (scales.size() < count) scales.resize(count);
    if (kind == QWeight::kQ4_1) {
      act_block_scales_q8_1(reinterpret_cast<const BlockQ8_1*>(act), blocks, m, scales.data());
    } else {
      act_block_scales(reinterpret_cast<const BlockQ8_0*>(act), blocks, m, scales.data());
    }
    act_scales = scales.data();
  }
  // Weight rows are read once: a tile of rows stays in L1 while every activation row is dotted with it.
  constexpr int64_t kTile = 16;
  // a thread's share is at least ~32 KiB of weight blocks times the rows beside them: enough to outweigh the
  // fork-join, small enough that a 2048-row layer at one token splits over two threads (a whole dot stays on one
  // thread either way, so the bits do not depend on the thread count)
  const int64_t grain = std::max<int64_t>(kTile, static_cast<int64_t>(32768 / (w_row_bytes * std::max<int64_t>(m, 1))));
  at::parallel_for(0, n_out, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> tile_buffer;
    if (tile_buffer.size() < static_cast<size_t>(kTile * m)) tile_buffer.resize(kTile * m);
    float* tile = tile_buffer.data();  // [m, kTile]
    for (int64_t n0 = begin; n0 < end; n0 += kTile) {
      const int64_t n1 = std::min(end, n0 + kTile);
      if (multi_row) {
        q8_gemm_rows(kind, weight + n0 * w_row_bytes, w_row_bytes, 0, n1 - n0, act, act_scales, blocks, m, tile,
                     kTile, vnni);
      } else {
        for (int64_t r = 0; r < m; ++r) {
          const uint8_t* a = act + r * act_row_bytes;
          for (int64_t n = n0; n < n1; ++n) {
            traits->vec_dot(static_cast<int>(k), &tile[r * kTile + n - n0], 0, weight + n * w_row_bytes, 0, a, 0, 1);
          }
        }
      }
      for (int64_t r = 0; r < m; ++r) {
        Out* y = out + r * n_out;
        for (int64_t n = n0; n < n1; ++n) y[n] = static_cast<Out>(tile[r * kTile + n - n0]);
      }
    }
  });
}

X8Path x8_path() {
  return x8_best_path(g_fast_kernels, g_vnni);
}

// Interleaved layouts: groups of 8 weight rows against every activation row; a whole dot stays on one thread.
// act: m rows of `blocks` Q8_0 blocks (Q8_1 for Q4_1x8, Q8_K for Q4_Kx8 / Q6_Kx8, read in place).
template <typename Out>
void run_linear_x8(X8Kind kind, const uint8_t* weight, int64_t n_out, int64_t k, const uint8_t* act, int64_t m,
                   Out* out) {
  const int64_t blocks = k / x8_block_values(kind), groups = n_out / kX8Rows;
  X8Activations activations{};
  if (!x8_is_k(kind)) {
    const auto count = static_cast<size_t>(blocks * m);
    Scratch& s = scratch();
    if (s.act_scales.size() < count) s.act_scales.resize(count);
    if (s.act_sums.size() < count) s.act_sums.resize(count), s.act_mins.resize(count);
    if (s.act_values.size() < count * 32) s.act_values.resize(count * 32);
    x8_act_prepare(kind == X8Kind::kQ4_1, act, blocks, m, s.act_values.data(), s.act_scales.data(),
                   s.act_sums.data(), s.act_mins.data());
    activations = X8Activations{s.act_values.data(), s.act_scales.data(), s.act_sums.data(), s.act_mins.data()};
  }
  const auto* act_k = reinterpret_cast<const BlockQ8_K*>(act);
  const X8Path path = x8_path();
  const auto gemm = [&](int64_t g0, int64_t g1, float* y, int64_t stride) {
    if (x8_is_k(kind)) {
      x8k_gemm(kind, path, weight, g0, g1, act_k, blocks, m, y, stride);
    } else {
      x8_gemm(kind, path, weight, g0, g1, activations, blocks, m, y, stride);
    }
  };
  constexpr int64_t kTileGroups = 4;
  const int64_t group_bytes = static_cast<int64_t>(blocks * x8_block_bytes(kind));
  const int64_t grain = std::max<int64_t>(kTileGroups, 32768 / (group_bytes * std::max<int64_t>(m, 1)));
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<Out, float>) {
      gemm(begin, end, out + begin * kX8Rows, n_out);
    } else {
      thread_local std::vector<float> tile_buffer;
      constexpr int64_t kTile = kTileGroups * kX8Rows;
      if (tile_buffer.size() < static_cast<size_t>(kTile * m)) tile_buffer.resize(kTile * m);
      float* tile = tile_buffer.data();  // [m, kTile], column 0 = weight row 8 * g0
      for (int64_t g0 = begin; g0 < end; g0 += kTileGroups) {
        const int64_t g1 = std::min(end, g0 + kTileGroups);
        gemm(g0, g1, tile, kTile);
        for (int64_t r = 0; r < m; ++r) {
          Out* y = out + r * n_out;
          for (int64_t n = g0 * kX8Rows; n < g1 * kX8Rows; ++n) y[n] = static_cast<Out>(tile[r * kTile + n - g0 * kX8Rows]);
        }
      }
    }
  });
}

at::Tensor ggml_linear(const at::Tensor& x, const at::Tensor& weight, int64_t weight_type) {
  const ggml_type type = checked_type(weight_type);
  TORCH_CHECK(x.device().is_cpu(), "ggml_linear: x must be on the CPU, got ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "ggml_linear: x must be float32 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1, "ggml_linear: x must have a feature dimension");
  const int64_t k = x.size(-1);
  check_weight(weight, type, k, "ggml_linear");
  const GgmlApi& ggml = api();
  const int64_t n_out = weight.size(0);
  const at::Tensor input = x.contiguous();
  const int64_t m = k == 0 ? 0 : input.numel() / k;

  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n_out;
  at::Tensor out = at::empty(out_shape, x.options());
  if (m == 0 || n_out == 0) return out;

  // activations in the vec_dot type, one row at a time (each row's quantization is its own)
  const ggml_type_traits_cpu* traits = ggml.traits_cpu(row_type(type));
  const ggml_type act_type = traits->vec_dot_type;
  const size_t act_row_bytes = ggml.row_size(act_type, k);
  Scratch& s = scratch();
  if (s.quantized.size() < act_row_bytes * m) s.quantized.resize(act_row_bytes * m);
  const float* rows = nullptr;
  if (x.scalar_type() == at::kBFloat16) {
    if (s.rows.size() < static_cast<size_t>(m * k)) s.rows.resize(m * k);
    const c10::BFloat16* src = input.data_ptr<c10::BFloat16>();
    for (int64_t i = 0; i < m * k; ++i) s.rows[i] = static_cast<float>(src[i]);
    rows = s.rows.data();
  } else {
    rows = input.data_ptr<float>();
  }
  if (act_type == GGML_TYPE_F32) {
    std::memcpy(s.quantized.data(), rows, act_row_bytes * m);
  } else {
    const ggml_type_traits_cpu* act_traits = ggml.traits_cpu(act_type);
    TORCH_CHECK(act_traits->from_float != nullptr, "ggml has no CPU quantizer for ", ggml.type_name(act_type));
    for (int64_t r = 0; r < m; ++r) act_traits->from_float(rows + r * k, s.quantized.data() + r * act_row_bytes, k);
  }

  const uint8_t* w = weight.data_ptr<uint8_t>();
  if (is_x8(type)) {
    if (x.scalar_type() == at::kFloat) {
      run_linear_x8(x8_kind(type), w, n_out, k, s.quantized.data(), m, out.data_ptr<float>());
    } else {
      run_linear_x8(x8_kind(type), w, n_out, k, s.quantized.data(), m, out.data_ptr<c10::BFloat16>());
    }
  } else if (x.scalar_type() == at::kFloat) {
    run_linear(ggml, type, w, n_out, k, s.quantized.data(), act_row_bytes, m, out.data_ptr<float>());
  } else {
    run_linear(ggml, type, w, n_out, k, s.quantized.data(), act_row_bytes, m, out.data_ptr<c10::BFloat16>());
  }
  return out;
}

at::Tensor ggml_embedding(const at::Tensor& weight, int64_t weight_type, int64_t in_features, const at::Tensor& ids,
                          at::ScalarType dtype) {
  const ggml_type type = checked_type(weight_type);
  check_weight(weight, type, in_features, "ggml_embedding");
  TORCH_CHECK(ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt,
              "ggml_embedding: ids must be int64 or int32, got ", ids.scalar_type());
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "ggml_embedding: dtype must be float32 or bfloat16, got ",
              dtype);
  const GgmlApi& ggml = api();
  const at::Tensor index = ids.to(at::kLong).contiguous();
  const int64_t count = index.numel(), vocab = weight.size(0), k = in_features;
  std::vector<int64_t> out_shape(ids.sizes().begin(), ids.sizes().end());
  out_shape.push_back(k);
  at::Tensor out = at::empty(out_shape, weight.options().dtype(dtype));
  const int64_t* id = index.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < vocab, "ggml_embedding: token id ", id[i], " is outside the vocabulary [0, ",
                vocab, ")");
  }
  const RowReader read(ggml, type, weight, k);
  if (dtype == at::kFloat) {
    float* y = out.data_ptr<float>();
    for (int64_t i = 0; i < count; ++i) read(id[i], y + i * k);
  } else {
    Scratch& s = scratch();
    if (s.rows.size() < static_cast<size_t>(k)) s.rows.resize(k);
    c10::BFloat16* y = out.data_ptr<c10::BFloat16>();
    for (int64_t i = 0; i < count; ++i) {
      read(id[i], s.rows.data());
      for (int64_t j = 0; j < k; ++j) y[i * k + j] = static_cast<c10::BFloat16>(s.rows[j]);
    }
  }
  return out;
}

at::Tensor ggml_quantize(const at::Tensor& w, int64_t weight_type) {
  const ggml_type type = checked_type(weight_type);
  TORCH_CHECK(!is_x8(type), "ggml_quantize: ", type_label(api(), type), " is a layout, not a quantizer: quantize to ",
              api().type_name(row_type(type)), ", then ggml_repack");
  TORCH_CHECK(w.dim() == 2, "ggml_quantize: weight must be 2-D [N, K], got shape ", w.sizes());
  const GgmlApi& ggml = api();
  const at::Tensor src = w.to(at::kFloat).contiguous();
  const int64_t n = src.size(0), k = src.size(1);
  TORCH_CHECK(k > 0 && k % ggml.blck_size(type) == 0, "ggml_quantize: K = ", k, " is not a positive multiple of ",
              ggml.type_name(type), "'s block size ", ggml.blck_size(type));
  const size_t row_bytes = ggml.row_size(type, k);
  at::Tensor out = at::empty({n, static_cast<int64_t>(row_bytes)}, src.options().dtype(at::kByte));
  ggml.quantize_chunk(type, src.data_ptr<float>(), out.data_ptr<uint8_t>(), 0, n, k, nullptr);
  return out;
}

at::Tensor ggml_dequantize(const at::Tensor& weight, int64_t weight_type, int64_t in_features) {
  const ggml_type type = checked_type(weight_type);
  check_weight(weight, type, in_features, "ggml_dequantize");
  const GgmlApi& ggml = api();
  const int64_t n = weight.size(0);
  at::Tensor out = at::empty({n, in_features}, weight.options().dtype(at::kFloat));
  const RowReader read(ggml, type, weight, in_features);
  float* y = out.data_ptr<float>();
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) read(i, y + i * in_features);
  });
  return out;
}

// Q8_0 / Q5_0 / Q4_1 / Q4_K / Q6_K blocks [N, row_bytes] (N a multiple of 8) -> their interleaved layout, the
// same shape.
at::Tensor ggml_repack(const at::Tensor& weight, int64_t weight_type, int64_t in_features) {
  const ggml_type type = checked_type(weight_type);
  const Layout* layout = layout_for(type);
  TORCH_CHECK(layout != nullptr, "ggml_repack: only Q8_0, Q5_0, Q4_1, Q4_K and Q6_K weights repack (to Q8_0x8 / ",
              "Q5_0x8 / Q4_1x8 / Q4_Kx8 / Q6_Kx8), got ", type_label(api(), type));
  check_weight(weight, type, in_features, "ggml_repack");
  const int64_t n = weight.size(0);
  TORCH_CHECK(n % kX8Rows == 0, "ggml_repack: interleaved weights hold groups of ", kX8Rows, " rows, got ", n, " rows");
  at::Tensor out = at::empty_like(weight);
  repack_x8(layout->kind, weight.data_ptr<uint8_t>(), n, in_features / x8_block_values(layout->kind),
            out.data_ptr<uint8_t>());
  return out;
}

// An interleaved layout [N, row_bytes] -> the file type's blocks [N, row_bytes] it holds (gathering rows, saving).
at::Tensor ggml_unrepack(const at::Tensor& weight, int64_t weight_type, int64_t in_features) {
  const ggml_type type = checked_type(weight_type);
  TORCH_CHECK(is_x8(type), "ggml_unrepack: ", type_label(api(), type), " is not an interleaved layout");
  check_weight(weight, type, in_features, "ggml_unrepack");
  const int64_t n = weight.size(0), blocks = in_features / x8_block_values(x8_kind(type)), row_bytes = weight.size(1);
  at::Tensor out = at::empty_like(weight);
  for (int64_t row = 0; row < n; ++row) {
    unpack_x8_row(x8_kind(type), weight.data_ptr<uint8_t>(), row, blocks, out.data_ptr<uint8_t>() + row * row_bytes);
  }
  return out;
}

}  // namespace

int64_t ggml_row_bytes(int64_t weight_type, int64_t in_features) {
  const ggml_type type = row_type(checked_type(weight_type));
  const GgmlApi& ggml = api();
  TORCH_CHECK(in_features > 0 && in_features % ggml.blck_size(type) == 0, "in_features ", in_features,
              " is not a positive multiple of ", ggml.type_name(type), "'s block size ", ggml.blck_size(type));
  return static_cast<int64_t>(ggml.row_size(type, in_features));
}

bool ggml_load(const std::string& library_dir) {
  std::lock_guard<std::mutex> lock(g_load_mutex);
  if (g_api.loaded) return true;
  const std::string base_path = library_dir + "/libggml-base.so", cpu_path = library_dir + "/libggml-cpu.so";
  void* base = dlopen(base_path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  TORCH_CHECK(base != nullptr, "cannot load ", base_path, ": ", dlerror());
  void* cpu = dlopen(cpu_path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  TORCH_CHECK(cpu != nullptr, "cannot load ", cpu_path, ": ", dlerror());
  GgmlApi loaded;
  resolve(base, "ggml_row_size", loaded.row_size, base_path);
  resolve(base, "ggml_blck_size", loaded.blck_size, base_path);
  resolve(base, "ggml_type_name", loaded.type_name, base_path);
  resolve(base, "ggml_get_type_traits", loaded.traits, base_path);
  resolve(base, "ggml_quantize_chunk", loaded.quantize_chunk, base_path);
  resolve(cpu, "ggml_cpu_init", loaded.cpu_init, cpu_path);
  resolve(cpu, "ggml_get_type_traits_cpu", loaded.traits_cpu, cpu_path);
  loaded.cpu_init();  // fp16 tables; idempotent
  loaded.loaded = true;
  g_api = loaded;
  return true;
}

bool ggml_loaded() { return g_api.loaded; }

bool set_fast_kernels(bool enabled) {
  const bool previous = g_fast_kernels;
  g_fast_kernels = enabled;
  return previous;
}

bool fast_kernels_available() { return q8_kernels_supported(); }

bool set_vnni(bool enabled) {
  const bool previous = g_vnni;
  g_vnni = enabled;
  return previous;
}

bool vnni_available() { return vnni_supported(); }

}  // namespace specswap::quant

TORCH_LIBRARY_FRAGMENT(specswap, m) {
  m.def("ggml_linear(Tensor x, Tensor weight, int weight_type) -> Tensor");
  m.def("ggml_embedding(Tensor weight, int weight_type, int in_features, Tensor ids, ScalarType dtype) -> Tensor");
  m.def("ggml_quantize(Tensor weight, int weight_type) -> Tensor");
  m.def("ggml_dequantize(Tensor weight, int weight_type, int in_features) -> Tensor");
  m.def("ggml_repack(Tensor weight, int weight_type, int in_features) -> Tensor");
  m.def("ggml_unrepack(Tensor weight, int weight_type, int in_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(specswap, CPU, m) {
  m.impl("ggml_linear", &specswap::quant::ggml_linear);
  m.impl("ggml_embedding", &specswap::quant::ggml_embedding);
  m.impl("ggml_quantize", &specswap::quant::ggml_quantize);
  m.impl("ggml_dequantize", &specswap::quant::ggml_dequantize);
  m.impl("ggml_repack", &specswap::quant::ggml_repack);
  m.impl("ggml_unrepack", &specswap::quant::ggml_unrepack);
}
