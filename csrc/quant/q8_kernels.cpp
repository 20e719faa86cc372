// Multi-row dot products over Q8_0 / Q5_0 / Q4_0 weights (Q8_0 activations), Q4_1 (Q8_1) and Q4_K / Q6_K (Q8_K
// activations); q8_kernels.h says why and what the bits equal. Compiled with per-function target attributes
// and chosen at run time, so the extension itself needs no AVX2 to load.
#include "quant/q8_kernels.h"
#include "quant/simd_bits.h"

#include <immintrin.h>

#include <cstring>

namespace specswap::quant {

bool q8_kernels_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool vnni_supported() {
  __builtin_cpu_init();
  return q8_kernels_supported() && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

#define SPECSWAP_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SPECSWAP_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

namespace {

constexpr int kMaxRows = 8;  // activation rows dotted with one unpacked weight block

SPECSWAP_AVX2 inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

SPECSWAP_AVX2 inline float hsum(__m256 v) {
  const __m128 pair = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 quad = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
  return _mm_cvtss_f32(_mm_add_ss(quad, _mm_movehdup_ps(quad)));
}

// ---- Q8_0 family -------------------------------------------------------------------------------------------

template <QWeight kKind>
constexpr size_t kBlockBytes = kKind == QWeight::kQ8_0 ? sizeof(BlockQ8_0)
                               : kKind == QWeight::kQ5_0 ? sizeof(BlockQ5_0)
                                                         : sizeof(BlockQ4_0);

// 32 signed weight values of one block as int8 lanes, and its scale
template <QWeight kKind>
SPECSWAP_AVX2 inline __m256i unpack(const uint8_t* block, float* scale) {
  if constexpr (kKind == QWeight::kQ8_0) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(block);
    *scale = half_to_float(b->d);
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs));
  } else {
    // low nibbles hold values 0..15, high nibbles 16..31
    const uint8_t* qs = kKind == QWeight::kQ5_0 ? reinterpret_cast<const BlockQ5_0*>(block)->qs
                                                : reinterpret_cast<const BlockQ4_0*>(block)->qs;
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i nibbles =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F));
    if constexpr (kKind == QWeight::kQ4_0) {
      *scale = half_to_float(reinterpret_cast<const BlockQ4_0*>(block)->d);
      return _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8));
    } else {
      const auto* b = reinterpret_cast<const BlockQ5_0*>(block);
      *scale = half_to_float(b->d);
      uint32_t high;
      std::memcpy(&high, b->qh, sizeof(high));
      const __m256i has_high = bits_to_bytes(high);  // byte j: bit j of `high`
      // value - 16: with the high bit, nibble + 16 - 16 = nibble; without it, nibble - 16 = nibble | 0xF0
      return _mm256_or_si256(nibbles, _mm256_andnot_si256(has_high, _mm256_set1_epi8(static_cast<char>(0xF0))));
    }
  }
}

// The integer dot of one block: 8 int32 lanes, lane i the sum of bytes 4i..4i+3 of |w| * sign(x, w). Both
// forms are exact (|w| <= 128, |x| <= 127: no int16 pair saturates), so they give the same lanes.
SPECSWAP_AVX2 inline __m256i block_dot_avx2(__m256i wabs, __m256i signed_x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, signed_x), _mm256_set1_epi16(1));
}
SPECSWAP_VNNI inline __m256i block_dot_vnni(__m256i wabs, __m256i signed_x) {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), wabs, signed_x);
}

// Weight rows [0, rows) against kRows activation rows: per block, ggml's AVX2 vec_dot operations in its order
// (scale = d_w * d_x, one fused multiply-add into 8 lanes), then its horizontal sum; out[r * stride + n].
#define SPECSWAP_DOT_GROUP(NAME, TARGET, BLOCK_DOT)                                                            \
  template <QWeight kKind, int kRows>                                                                          \
  TARGET void NAME(const uint8_t* weight, size_t row_bytes, int64_t rows, const BlockQ8_0* const* act,          \
                   const float* const* xscale, int64_t blocks, float* out, int64_t stride) {                   \
    for (int64_t n = 0; n < rows; ++n) {                                                                       \
      const uint8_t* wrow = weight + n * row_bytes;                                                            \
      __m256 acc[kRows];                                                                                       \
      for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();                                            \
      for (int64_t b = 0; b < blocks; ++b) {                                                                   \
        float wscale;                                                                                          \
        const __m256i w = unpack<kKind>(wrow + b * kBlockBytes<kKind>, &wscale);                               \
        const __m256i wabs = _mm256_sign_epi8(w, w); /* |w| as unsigned bytes; the sign moves onto x */        \
        const __m256 ws = _mm256_set1_ps(wscale);                                                              \
        for (int r = 0; r < kRows; ++r) {                                                                      \
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[r][b].qs));                \
          const __m256 dots = _mm256_cvtepi32_ps(BLOCK_DOT(wabs, _mm256_sign_epi8(x, w)));                     \
          const __m256 scale = _mm256_mul_ps(ws, _mm256_broadcast_ss(xscale[r] + b));                          \
          acc[r] = _mm256_fmadd_ps(scale, dots, acc[r]);                                                       \
        }                                                                                                      \
      }                                                                                                        \
      for (int r = 0; r < kRows; ++r) out[r * stride + n] = hsum(acc[r]);                                      \
    }                                                                                                          \
  }

SPECSWAP_DOT_GROUP(dot_group_avx2, SPECSWAP_AVX2, block_dot_avx2)
SPECSWAP_DOT_GROUP(dot_group_vnni, SPECSWAP_VNNI, block_dot_vnni)
#undef SPECSWAP_DOT_GROUP

// Q4_1 against Q8_1: per block ggml's AVX2 operations (the unsigned nibbles times the signed activations, scale
// d_w * d_x, one fused multiply-add into 8 lanes), the min term m_w * s_x summed apart in a float, and at the end
// the horizontal sum plus that sum, as ggml's vec_dot adds them; out[r * stride + n].
#define SPECSWAP_Q4_1_GROUP(NAME, TARGET, BLOCK_DOT)                                                           \
  template <int kRows>                                                                                         \
  TARGET void NAME(const uint8_t* weight, size_t row_bytes, int64_t rows, const BlockQ8_1* const* act,         \
                   const float* const* xscale, int64_t blocks, float* out, int64_t stride) {                   \
    for (int64_t n = 0; n < rows; ++n) {                                                                       \
      const auto* wrow = reinterpret_cast<const BlockQ4_1*>(weight + n * row_bytes);                          \
      __m256 acc[kRows];                                                                                       \
      float mins[kRows];                                                                                       \
      for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps(), mins[r] = 0.0f;                            \
      for (int64_t b = 0; b < blocks; ++b) {                                                                   \
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wrow[b].qs));                  \
        const __m256i w =                                                                                      \
            _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F));     \
        const float d = half_to_float(wrow[b].d), m = half_to_float(wrow[b].m);                                \
        const __m256 ws = _mm256_set1_ps(d);                                                                   \
        for (int r = 0; r < kRows; ++r) {                                                                      \
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[r][b].qs));                \
          mins[r] += m * xscale[r][blocks + b];                                                                \
          const __m256 dots = _mm256_cvtepi32_ps(BLOCK_DOT(w, x));                                             \
          acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(ws, _mm256_broadcast_ss(xscale[r] + b)), dots, acc[r]);      \
        }                                                                                                      \
      }                                                                                                        \
      for (int r = 0; r < kRows; ++r) out[r * stride + n] = hsum(acc[r]) + mins[r];                            \
    }                                                                                                          \
  }

SPECSWAP_Q4_1_GROUP(q4_1_group_avx2, SPECSWAP_AVX2, block_dot_avx2)
SPECSWAP_Q4_1_GROUP(q4_1_group_vnni, SPECSWAP_VNNI, block_dot_vnni)
#undef SPECSWAP_Q4_1_GROUP

// ---- K-quants ----------------------------------------------------------------------------------------------

// One super-block unpacked once for every activation row: 8 chunks of 32 unsigned values and, per chunk, the
// int16 multipliers of its pairs; `offset` multiplies the activation's 16 bsums (the mins of Q4_K, the -32 of
// Q6_K, folded into one integer correction).
struct UnpackedK {
  __m256i q[8];
  __m256i scale[8];
  __m256i offset;
  float d, dmin;
};

// pshufb masks that copy int16 lane j of a 128-bit half to all its eight lanes
SPECSWAP_AVX2 inline __m256i broadcast_lane16(__m256i v, int j) {
  const char lo = static_cast<char>(2 * j), hi = static_cast<char>(2 * j + 1);
  return _mm256_shuffle_epi8(v, _mm256_setr_epi8(lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi,
                                                 lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi));
}

SPECSWAP_AVX2 inline void unpack_q4_k(const BlockQ4_K& b, UnpackedK* u) {
  // the 12 packed bytes to 8 scale bytes then 8 min bytes (ggml's get_scale_min_k4, four words at a time)
  constexpr uint32_t kSix = 0x3f3f3f3f, kFour = 0x0f0f0f0f, kTwo = 0x03030303;
  uint32_t w[4];
  std::memcpy(w, b.scales, 12);
  w[3] = ((w[2] >> 4) & kFour) | (((w[1] >> 6) & kTwo) << 4);
  const uint32_t mins_low = w[1] & kSix;
  w[1] = (w[2] & kFour) | (((w[0] >> 6) & kTwo) << 4);
  w[2] = mins_low;
  w[0] &= kSix;
  // now w[0..1]: scales 0..7, w[2..3]: mins 0..7
  const __m128i packed = _mm_set_epi32(static_cast<int>(w[3]), static_cast<int>(w[2]), static_cast<int>(w[1]),
                                       static_cast<int>(w[0]));
  const __m256i wide = _mm256_cvtepu8_epi16(packed);  // int16: scales in lanes 0..7, mins in 8..15
  const __m256i scales = _mm256_permute2x128_si256(wide, wide, 0x00);  // scales in both halves
  for (int j = 0; j < 8; ++j) u->scale[j] = broadcast_lane16(scales, j);
  const __m128i mins = _mm256_extracti128_si256(wide, 1);
  // sub-block j covers bsums 2j and 2j + 1: [m0 m0 m1 m1 ... m7 m7]
  u->offset = _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins));
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int t = 0; t < 4; ++t) {  // sub-block 2t: low nibbles of qs[32t..], 2t + 1: their high nibbles
    const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * t));
    u->q[2 * t] = _mm256_and_si256(qs, low);
    u->q[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16(qs, 4), low);
  }
  u->d = half_to_float(b.d);
  u->dmin = half_to_float(b.dmin);
}

SPECSWAP_AVX2 inline void unpack_q6_k(const BlockQ6_K& b, UnpackedK* u) {
  const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x30);
  for (int n = 0; n < 2; ++n) {  // halves of 128 values: ql[64n..], qh[32n..], scales[8n..]
    const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * n));
    const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * n + 32));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * n));
    // chunk t holds values 32t..32t+31 of the half; its high bits are bits 2t, 2t + 1 of qh, moved to 4..5
    u->q[4 * n + 0] = _mm256_or_si256(_mm256_and_si256(ql0, low), _mm256_and_si256(_mm256_slli_epi16(qh, 4), two));
    u->q[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low), _mm256_and_si256(_mm256_slli_epi16(qh, 2), two));
    u->q[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low), _mm256_and_si256(qh, two));
    u->q[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                                      _mm256_and_si256(_mm256_srli_epi16(qh, 2), two));
  }
  // chunk c spans groups 2c and 2c + 1 of 16 values: int16 lanes 0..7 get scale 2c, lanes 8..15 scale 2c + 1
  const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
  for (int c = 0; c < 8; ++c) {
    const char lo = static_cast<char>(2 * c), hi = static_cast<char>(2 * c + 1);
    u->scale[c] = _mm256_cvtepi8_epi16(
        _mm_shuffle_epi8(scales, _mm_setr_epi8(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi)));
  }
  // values are stored + 32: the correction is 32 * sum_g scale_g * bsum_g
  u->offset = _mm256_cvtepi8_epi16(scales);
  u->d = half_to_float(b.d);
  u->dmin = 0.0f;
}

// Weight rows [0, rows) against kRows activation rows, per super-block: the integer dot (exact in int32), then
// one or two fused multiply-adds by d_w * d_x; one fixed horizontal sum at the end; out[r * stride + n].
template <QWeight kKind, int kRows>
SPECSWAP_AVX2 void dot_group_k(const uint8_t* weight, size_t row_bytes, int64_t rows, const BlockQ8_K* const* act,
                               int64_t blocks, float* out, int64_t stride) {
  UnpackedK u;
  for (int64_t n = 0; n < rows; ++n) {
    const uint8_t* wrow = weight + n * row_bytes;
    __m256 acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      if constexpr (kKind == QWeight::kQ4_K) {
        unpack_q4_k(reinterpret_cast<const BlockQ4_K*>(wrow)[b], &u);
      } else {
        unpack_q6_k(reinterpret_cast<const BlockQ6_K*>(wrow)[b], &u);
      }
      for (int r = 0; r < kRows; ++r) {
        const BlockQ8_K& y = act[r][b];
        __m256i sum = _mm256_setzero_si256();
        for (int c = 0; c < 8; ++c) {
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 32 * c));
          sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(u.q[c], x), u.scale[c]));
        }
        const __m256i offset =
            _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums)), u.offset);
        if constexpr (kKind == QWeight::kQ4_K) {
          acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(u.d * y.d), _mm256_cvtepi32_ps(sum), acc[r]);
          acc[r] = _mm256_fnmadd_ps(_mm256_set1_ps(u.dmin * y.d), _mm256_cvtepi32_ps(offset), acc[r]);
        } else {
          sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(offset, 5));
          acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(u.d * y.d), _mm256_cvtepi32_ps(sum), acc[r]);
        }
      }
    }
    for (int r = 0; r < kRows; ++r) out[r * stride + n] = hsum(acc[r]);
  }
}

// ---- driver ------------------------------------------------------------------------------------------------

// Weight rows [0, rows) against activation rows [r0, r0 + kRows).
template <QWeight kKind, int kRows>
void dot_group(const uint8_t* weight, size_t row_bytes, int64_t rows, const void* act, const float* scales,
               int64_t blocks, int64_t r0, bool vnni, float* out, int64_t stride) {
  if constexpr (is_k_quant(kKind)) {
    const BlockQ8_K* act_rows[kRows];
    for (int r = 0; r < kRows; ++r) act_rows[r] = static_cast<const BlockQ8_K*>(act) + (r0 + r) * blocks;
    dot_group_k<kKind, kRows>(weight, row_bytes, rows, act_rows, blocks, out, stride);
  } else if constexpr (kKind == QWeight::kQ4_1) {
    const BlockQ8_1* act_rows[kRows];
    const float* xscale[kRows];  // each row's scales, then its sums
    for (int r = 0; r < kRows; ++r) {
      act_rows[r] = static_cast<const BlockQ8_1*>(act) + (r0 + r) * blocks;
      xscale[r] = scales + (r0 + r) * 2 * blocks;
    }
    if (vnni) {
      q4_1_group_vnni<kRows>(weight, row_bytes, rows, act_rows, xscale, blocks, out, stride);
    } else {
      q4_1_group_avx2<kRows>(weight, row_bytes, rows, act_rows, xscale, blocks, out, stride);
    }
  } else {
    const BlockQ8_0* act_rows[kRows];
    const float* xscale[kRows];
    for (int r = 0; r < kRows; ++r) {
      act_rows[r] = static_cast<const BlockQ8_0*>(act) + (r0 + r) * blocks;
      xscale[r] = scales + (r0 + r) * blocks;
    }
    if (vnni) {
      dot_group_vnni<kKind, kRows>(weight, row_bytes, rows, act_rows, xscale, blocks, out, stride);
    } else {
      dot_group_avx2<kKind, kRows>(weight, row_bytes, rows, act_rows, xscale, blocks, out, stride);
    }
  }
}

template <QWeight kKind>
void gemm(const uint8_t* weight, size_t weight_row_bytes, int64_t n0, int64_t n1, const void* act,
          const float* scales, int64_t blocks, int64_t m, float* out, int64_t out_stride, bool vnni) {
  const uint8_t* first = weight + n0 * weight_row_bytes;
  const int64_t rows = n1 - n0;
  for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
    const int group = static_cast<int>(m - r0 < kMaxRows ? m - r0 : kMaxRows);
    float* y = out + r0 * out_stride + n0;
#define SPECSWAP_GROUP(R) \
  case R: dot_group<kKind, R>(first, weight_row_bytes, rows, act, scales, blocks, r0, vnni, y, out_stride); break;
    switch (group) {
      SPECSWAP_GROUP(8) SPECSWAP_GROUP(7) SPECSWAP_GROUP(6) SPECSWAP_GROUP(5)
      SPECSWAP_GROUP(4) SPECSWAP_GROUP(3) SPECSWAP_GROUP(2)
      default: dot_group<kKind, 1>(first, weight_row_bytes, rows, act, scales, blocks, r0, vnni, y, out_stride);
    }
#undef SPECSWAP_GROUP
  }
}

SPECSWAP_AVX2 void block_scales(const BlockQ8_0* act, int64_t count, float* scales) {
  for (int64_t i = 0; i < count; ++i) scales[i] = half_to_float(act[i].d);
}

SPECSWAP_AVX2 void block_scales_q8_1(const BlockQ8_1* act, int64_t blocks, int64_t m, float* scales) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      scales[r * 2 * blocks + b] = half_to_float(act[r * blocks + b].d);
      scales[r * 2 * blocks + blocks + b] = half_to_float(act[r * blocks + b].s);
    }
  }
}

}  // namespace

void act_block_scales(const BlockQ8_0* act, int64_t blocks, int64_t m, float* scales) {
  block_scales(act, blocks * m, scales);
}

void act_block_scales_q8_1(const BlockQ8_1* act, int64_t blocks, int64_t m, float* scales) {
  block_scales_q8_1(act, blocks, m, scales);
}

void q8_gemm_rows(QWeight kind, const uint8_t* weight, size_t weight_row_bytes, int64_t n0, int64_t n1,
                  const void* act, const float* scales, int64_t blocks, int64_t m, float* out, int64_t out_stride,
                  bool vnni) {
#define SPECSWAP_KIND(K) \
  case QWeight::K: gemm<QWeight::K>(weight, weight_row_bytes, n0, n1, act, scales, blocks, m, out, out_stride, vnni); break;
  switch (kind) {
    SPECSWAP_KIND(kQ8_0) SPECSWAP_KIND(kQ5_0) SPECSWAP_KIND(kQ4_0) SPECSWAP_KIND(kQ4_1) SPECSWAP_KIND(kQ4_K)
    SPECSWAP_KIND(kQ6_K)
  }
#undef SPECSWAP_KIND
}

}  // namespace specswap::quant
