// exp(x) in float (and the switch of the operators that use it), as a scalar function and as 8 AVX2 lanes that give the same bits: the same multiplies and
// adds in the same order, never fused (the files that include this compile with -ffp-contract=off, and the AVX2
// functions enable AVX2 without FMA), and round-to-nearest-even for n in both. So an operator that uses it
// computes the same bits on every CPU, whichever form runs.
//
// Cephes' expf: x clamped to [-87.3, 88.7], n = round(x log2 e), r = x - n ln 2 (in two parts, Cody-Waite),
// exp(r) by a degree-7 polynomial, times 2^n built in the exponent bits. Relative error below 3e-7 over the
// range (tests/models/test_activations.py checks the activations built on it against float64 torch). Below -87.3 it returns exp(-87.3), about
// 1.2e-38, not 0: the softmax weights and activations that use it cannot tell.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace specswap::cpu_ops::simd_math {

// Whether the operators built on these functions (invariant_attention, gated_activation) run their AVX2 forms:
// where the CPU has AVX2, unless set_simd(false) (tests compare the forms). set_simd returns the previous setting.
bool simd_enabled();
bool set_simd(bool enabled);

inline constexpr float kExpHi = 88.7f, kExpLo = -87.3f, kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                       kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

inline float exp(float x) {
  x = std::fmin(std::fmax(x, kExpLo), kExpHi);
  const float n = std::nearbyint(x * kLog2e);
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  const float z = r * r;
  float p = kP0;
  p = p * r + kP1;
  p = p * r + kP2;
  p = p * r + kP3;
  p = p * r + kP4;
  p = p * r + kP5;
  p = p * z + r;
  p = p + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

__attribute__((target("avx2"))) inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Hi)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Lo)));
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kP1));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kP2));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kP3));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kP4));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kP5));
  p = _mm256_add_ps(_mm256_mul_ps(p, z), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

}  // namespace specswap::cpu_ops::simd_math
