// AVX2 multi-row dot products over Q8_0 / Q5_0 / Q4_0 weight blocks and Q8_0 activation blocks
// (q8_kernels.h says why). Compiled with per-function target attributes and chosen at run time, so the
// extension itself needs no AVX2 to load.
#include "quant/q8_kernels.h"

#include <immintrin.h>

#include <cstring>

namespace specswap::quant {

bool q8_kernels_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

#define SPECSWAP_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace {

SPECSWAP_AVX2 inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// 32 signed weight values of one block as int8 lanes, and its scale
template <Q8Weight kKind>
SPECSWAP_AVX2 inline __m256i unpack(const uint8_t* block, float* scale) {
  if constexpr (kKind == Q8Weight::kQ8_0) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(block);
    *scale = half_to_float(b->d);
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs));
  } else {
    // low nibbles hold values 0..15, high nibbles 16..31
    const uint8_t* qs = kKind == Q8Weight::kQ5_0 ? reinterpret_cast<const BlockQ5_0*>(block)->qs
                                                 : reinterpret_cast<const BlockQ4_0*>(block)->qs;
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i nibbles =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F));
    if constexpr (kKind == Q8Weight::kQ4_0) {
      *scale = half_to_float(reinterpret_cast<const BlockQ4_0*>(block)->d);
      return _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8));
    } else {
      const auto* b = reinterpret_cast<const BlockQ5_0*>(block);
      *scale = half_to_float(b->d);
      uint32_t high;
      std::memcpy(&high, b->qh, sizeof(high));
      // byte j gets bit j of `high`: broadcast, spread one source byte per 8 lanes, test one bit per lane
      const __m256i spread = _mm256_shuffle_epi8(
          _mm256_set1_epi32(static_cast<int>(high)),
          _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
      const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
      const __m256i has_high = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
      // value - 16: with the high bit, nibble + 16 - 16 = nibble; without it, nibble - 16 = nibble | 0xF0
      return _mm256_or_si256(nibbles, _mm256_andnot_si256(has_high, _mm256_set1_epi8(static_cast<char>(0xF0))));
    }
  }
}

SPECSWAP_AVX2 inline float hsum(__m256 v) {
  const __m128 pair = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 quad = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
  return _mm_cvtss_f32(_mm_add_ss(quad, _mm_movehdup_ps(quad)));
}

// one weight row against kRows activation rows
template <Q8Weight kKind, int kRows>
SPECSWAP_AVX2 void dot_group(const uint8_t* wrow, size_t block_bytes, const BlockQ8_0* const* act, int64_t blocks,
                             float* result) {
  __m256 acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < blocks; ++b) {
    float wscale;
    const __m256i w = unpack<kKind>(wrow + b * block_bytes, &wscale);
    const __m256i wabs = _mm256_sign_epi8(w, w);  // |w| as unsigned bytes; the sign moves onto x
    for (int r = 0; r < kRows; ++r) {
      const BlockQ8_0& xb = act[r][b];
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
      const __m256i pairs = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(x, w));
      const __m256 dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(wscale * half_to_float(xb.d)), dots, acc[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) result[r] = hsum(acc[r]);
}

template <Q8Weight kKind>
SPECSWAP_AVX2 void gemm(const uint8_t* weight, size_t weight_row_bytes, int64_t n0, int64_t n1, const BlockQ8_0* act,
                        int64_t blocks, int64_t m, float* out, int64_t out_stride) {
  constexpr size_t kBlockBytes = kKind == Q8Weight::kQ8_0 ? sizeof(BlockQ8_0)
                                 : kKind == Q8Weight::kQ5_0 ? sizeof(BlockQ5_0)
                                                            : sizeof(BlockQ4_0);
  const BlockQ8_0* rows[4];
  float result[4];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wrow = weight + n * weight_row_bytes;
    for (int64_t r0 = 0; r0 < m; r0 += 4) {
      const int group = static_cast<int>(m - r0 < 4 ? m - r0 : 4);
      for (int r = 0; r < group; ++r) rows[r] = act + (r0 + r) * blocks;
      switch (group) {
        case 4: dot_group<kKind, 4>(wrow, kBlockBytes, rows, blocks, result); break;
        case 3: dot_group<kKind, 3>(wrow, kBlockBytes, rows, blocks, result); break;
        case 2: dot_group<kKind, 2>(wrow, kBlockBytes, rows, blocks, result); break;
        default: dot_group<kKind, 1>(wrow, kBlockBytes, rows, blocks, result); break;
      }
      for (int r = 0; r < group; ++r) out[(r0 + r) * out_stride + n] = result[r];
    }
  }
}

}  // namespace

void q8_gemm_rows(Q8Weight kind, const uint8_t* weight, size_t weight_row_bytes, int64_t n0, int64_t n1,
                  const BlockQ8_0* act, int64_t blocks, int64_t m, float* out, int64_t out_stride) {
  switch (kind) {
    case Q8Weight::kQ8_0: gemm<Q8Weight::kQ8_0>(weight, weight_row_bytes, n0, n1, act, blocks, m, out, out_stride); break;
    case Q8Weight::kQ5_0: gemm<Q8Weight::kQ5_0>(weight, weight_row_bytes, n0, n1, act, blocks, m, out, out_stride); break;
    case Q8Weight::kQ4_0: gemm<Q8Weight::kQ4_0>(weight, weight_row_bytes, n0, n1, act, blocks, m, out, out_stride); break;
  }
}

}  // namespace specswap::quant
