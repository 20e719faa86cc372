// A gated MLP's activation in one operator, fp32 on the CPU: y = act(gate) * up, elementwise.
//
//   gated_activation(gate [..., N] fp32, up [..., N] fp32, activation) -> [..., N] fp32
//   activation "gelu_tanh": 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), tanh(u) = 1 - 2 / (exp(2u) + 1);
//              "silu":      g / (1 + exp(-g)).
//
// torch spells it as two operators with an intermediate tensor, and its tanh-approximated GELU is not cheap per
// value (Gemma's MLP at 8 tokens: 16384 values a layer). Here the exp is simd_math.h's, whose scalar
// and AVX2 forms give the same bits, so every CPU computes the same output, and being elementwise a row's bits
// never depend on the rows beside it. Also home of simd_math's switch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <string>

#include "cpu_ops/simd_math.h"

namespace specswap::cpu_ops {
namespace simd_math {
namespace {

bool g_enabled = true;

bool avx2_supported() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return supported;
}

}  // namespace

bool simd_enabled() { return g_enabled && avx2_supported(); }

bool set_simd(bool enabled) {
  const bool previous = g_enabled;
  g_enabled = enabled;
  return previous;
}

}  // namespace simd_math

namespace {

enum class Activation { kGeluTanh, kSilu };

constexpr float kGeluC = 0.7978845608028654f, kGeluCubic = 0.044715f;

// ---- scalar: the reference --------------------------------------------------------------------------------------

inline float activate(Activation kind, float g) {
  if (kind == Activation::kSilu) return g / (1.0f + simd_math::exp(-g));
  const float u = kGeluC * (g + kGeluCubic * (g * g * g));
  const float tanh = 1.0f - 2.0f / (simd_math::exp(u + u) + 1.0f);
  return (0.5f * g) * (1.0f + tanh);
}

// ---- AVX2: the same operations, eight values at a time ---------------------------------------------------------

__attribute__((target("avx2"))) inline __m256 activate8(Activation kind, __m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  if (kind == Activation::kSilu) {
    const __m256 negated = _mm256_xor_ps(g, _mm256_set1_ps(-0.0f));  // -g, as the scalar form's
    return _mm256_div_ps(g, _mm256_add_ps(one, simd_math::exp8(negated)));
  }
  const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
  const __m256 u = _mm256_mul_ps(_mm256_set1_ps(kGeluC), _mm256_add_ps(g, _mm256_mul_ps(_mm256_set1_ps(kGeluCubic), cube)));
  const __m256 e = simd_math::exp8(_mm256_add_ps(u, u));
  const __m256 tanh = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), g), _mm256_add_ps(one, tanh));
}

__attribute__((target("avx2"))) void gated_avx2(Activation kind, const float* gate, const float* up, float* out,
                                                int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 a = activate8(kind, _mm256_loadu_ps(gate + i));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(a, _mm256_loadu_ps(up + i)));
  }
  for (; i < end; ++i) out[i] = activate(kind, gate[i]) * up[i];
}

void gated_scalar(Activation kind, const float* gate, const float* up, float* out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) out[i] = activate(kind, gate[i]) * up[i];
}

at::Tensor gated_activation(const at::Tensor& gate, const at::Tensor& up, c10::string_view activation) {
  Activation kind;
  if (activation == "gelu_tanh") {
    kind = Activation::kGeluTanh;
  } else if (activation == "silu") {
    kind = Activation::kSilu;
  } else {
    TORCH_CHECK(false, "gated_activation: activation '", std::string(activation),
                "' is not supported; valid: gelu_tanh, silu");
  }
  TORCH_CHECK(gate.scalar_type() == at::kFloat && up.scalar_type() == at::kFloat,
              "gated_activation: gate and up must be float32, got ", gate.scalar_type(), ", ", up.scalar_type());
  TORCH_CHECK(gate.sizes() == up.sizes(), "gated_activation: gate ", gate.sizes(), " and up ", up.sizes(),
              " must have the same shape");
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor out = at::empty_like(g);
  const float* gp = g.data_ptr<float>();
  const float* upp = u.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const bool simd = simd_math::simd_enabled();
  at::parallel_for(0, g.numel(), 4096, [&](int64_t begin, int64_t end) {
    if (simd) {
      gated_avx2(kind, gp, upp, op, begin, end);
    } else {
      gated_scalar(kind, gp, upp, op, begin, end);
    }
  });
  return out;
}

}  // namespace
}  // namespace specswap::cpu_ops

TORCH_LIBRARY_FRAGMENT(specswap, m) { m.def("gated_activation(Tensor gate, Tensor up, str activation) -> Tensor"); }

TORCH_LIBRARY_IMPL(specswap, CPU, m) { m.impl("gated_activation", &specswap::cpu_ops::gated_activation); }
