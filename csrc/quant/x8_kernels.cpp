// The Q8_0x8 / Q5_0x8 / Q4_1x8 kernels; x8_kernels.h gives the layouts and the arithmetic every path shares. Compiled
// with per-function target attributes and chosen at run time, as q8_kernels.cpp.
#include "quant/x8_kernels.h"
#include "quant/simd_bits.h"
#include "quant/x8_common.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>

namespace specswap::quant {
namespace {

using x8::dpbusd_broadcast, x8::half_to_float, x8::load256, x8::load_i32, x8::nibbles, x8::set_nibble;

#define SPECSWAP_X8_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SPECSWAP_X8_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

// the block header: 8 fp16 scales, and for Q4_1 then 8 fp16 mins
constexpr size_t header_bytes(X8Kind kind) { return kX8Rows * sizeof(uint16_t) * (kind == X8Kind::kQ4_1 ? 2 : 1); }
// values are stored unsigned, value + bias: the integer dot is dot(stored, x) - bias * sum(x)
constexpr int32_t value_bias(X8Kind kind) { return kind == X8Kind::kQ8_0 ? 128 : kind == X8Kind::kQ5_0 ? 16 : 0; }

// ---- layout: the stored (unsigned) value of chunk i, byte p -------------------------------------------------

// bit `index` of the little-endian 32-bit word at `word` set to `bit`
void set_bit(uint8_t* word, int index, unsigned bit) {
  uint32_t bits = static_cast<uint32_t>(load_i32(word));
  bits = (bits & ~(1u << index)) | ((bit & 1u) << index);
  std::memcpy(word, &bits, sizeof(bits));
}

uint8_t stored(X8Kind kind, const uint8_t* block, int i, int p) {
  const uint8_t* values = block + header_bytes(kind);
  if (kind == X8Kind::kQ8_0) return values[32 * i + p];
  const uint8_t packed = values[32 * (i % 4) + p];
  const uint8_t low = i < 4 ? (packed & 0x0F) : (packed >> 4);
  if (kind == X8Kind::kQ4_1) return low;
  const uint32_t high = static_cast<uint32_t>(load_i32(values + 128 + 4 * i));
  return static_cast<uint8_t>(low | (((high >> p) & 1u) << 4));
}

void store(X8Kind kind, uint8_t* block, int i, int p, uint8_t value) {
  uint8_t* values = block + header_bytes(kind);
  if (kind == X8Kind::kQ8_0) {
    values[32 * i + p] = value;
    return;
  }
  set_nibble(values[32 * (i % 4) + p], i >= 4, value);
  if (kind == X8Kind::kQ5_0) set_bit(values + 128 + 4 * i, p, value >> 4);
}

// a plain block's stored value v (0..31) and its scale (and Q4_1's min); Q5_0: q = nibble | bit v of qh << 4,
// Q4_1: q = nibble (ggml's layouts)
uint8_t plain_stored(X8Kind kind, const void* blocks, int64_t index, int v, uint16_t* d, uint16_t* m) {
  if (kind == X8Kind::kQ8_0) {
    const BlockQ8_0& b = static_cast<const BlockQ8_0*>(blocks)[index];
    *d = b.d;
    return static_cast<uint8_t>(static_cast<int>(b.qs[v]) + 128);
  }
  if (kind == X8Kind::kQ4_1) {
    const BlockQ4_1& b = static_cast<const BlockQ4_1*>(blocks)[index];
    *d = b.d;
    *m = b.m;
    return v < 16 ? (b.qs[v] & 0x0F) : (b.qs[v - 16] >> 4);
  }
  const BlockQ5_0& b = static_cast<const BlockQ5_0*>(blocks)[index];
  *d = b.d;
  const uint32_t high = static_cast<uint32_t>(load_i32(b.qh));
  const uint8_t nibble = v < 16 ? (b.qs[v] & 0x0F) : (b.qs[v - 16] >> 4);
  return static_cast<uint8_t>(nibble | (((high >> v) & 1u) << 4));
}

void plain_store(X8Kind kind, void* blocks, int64_t index, int v, uint8_t value, uint16_t d, uint16_t m) {
  if (kind == X8Kind::kQ8_0) {
    BlockQ8_0& b = static_cast<BlockQ8_0*>(blocks)[index];
    b.d = d;
    b.qs[v] = static_cast<int8_t>(static_cast<int>(value) - 128);
    return;
  }
  if (kind == X8Kind::kQ4_1) {
    BlockQ4_1& b = static_cast<BlockQ4_1*>(blocks)[index];
    b.d = d;
    b.m = m;
    set_nibble(b.qs[v % 16], v >= 16, value);
    return;
  }
  BlockQ5_0& b = static_cast<BlockQ5_0*>(blocks)[index];
  b.d = d;
  set_nibble(b.qs[v % 16], v >= 16, value);
  set_bit(b.qh, v, value >> 4);
}

// ---- scalar: the reference every SIMD path equals bit for bit ----------------------------------------------

void x8_gemm_scalar(X8Kind kind, const uint8_t* packed, int64_t g0, int64_t g1, const X8Activations& act,
                    int64_t blocks, int64_t m, float* out, int64_t stride) {
  const size_t block_bytes = x8_block_bytes(kind);
  const int32_t bias = value_bias(kind);
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = packed + g * blocks * block_bytes;
    for (int64_t r = 0; r < m; ++r) {
      float acc[kX8Rows] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* block = group + b * block_bytes;
        const int8_t* x = act.qs + (r * blocks + b) * 32;
        for (int j = 0; j < kX8Rows; ++j) {
          uint16_t d, min;
          std::memcpy(&d, block + 2 * j, sizeof(d));
          std::memcpy(&min, block + 16 + 2 * j, sizeof(min));
          int32_t dot = 0;
          for (int i = 0; i < 8; ++i) {
            for (int t = 0; t < 4; ++t) dot += (static_cast<int32_t>(stored(kind, block, i, 4 * j + t)) - bias) * x[4 * i + t];
          }
          const float scale = half_to_float(d) * act.scales[r * blocks + b];
          acc[j] = std::fma(scale, static_cast<float>(dot), acc[j]);
          if (kind == X8Kind::kQ4_1) acc[j] = std::fma(half_to_float(min), act.mins[r * blocks + b], acc[j]);
        }
      }
      for (int j = 0; j < kX8Rows; ++j) out[r * stride + (g - g0) * kX8Rows + j] = acc[j];
    }
  }
}

// ---- the 8 chunks of a block as registers --------------------------------------------------------------------

// stored (unsigned) values: VNNI's operand
template <X8Kind kKind>
SPECSWAP_X8_VNNI inline void chunks_unsigned(const uint8_t* block, __m256i* u) {
  const uint8_t* values = block + header_bytes(kKind);
  if constexpr (kKind == X8Kind::kQ8_0) {
    for (int i = 0; i < 8; ++i) u[i] = load256(values + 32 * i);
  } else {
    nibbles(values, u);
    if constexpr (kKind == X8Kind::kQ5_0) {  // plus 16 where the fifth bit is set
      const __m256i sixteen = _mm256_set1_epi8(16);
      for (int i = 0; i < 8; ++i) {
        const __mmask32 high = static_cast<__mmask32>(load_i32(values + 128 + 4 * i));
        u[i] = _mm256_mask_add_epi8(u[i], high, u[i], sixteen);
      }
    }
  }
}

// AVX2's operands for Q5_0 and Q4_1: the stored unsigned values, as VNNI's (Q8_0: q8_0_rows_avx2).
template <X8Kind kKind>
SPECSWAP_X8_AVX2 inline void chunks_avx2(const uint8_t* block, __m256i* w) {
  static_assert(kKind != X8Kind::kQ8_0);
  const uint8_t* values = block + header_bytes(kKind);
  nibbles(values, w);
  if constexpr (kKind == X8Kind::kQ5_0) {
    const __m256i sixteen = _mm256_set1_epi8(16);
    for (int i = 0; i < 8; ++i) {  // plus 16 where the fifth bit is set (byte p: bit p of the chunk's word)
      const __m256i has_high = bits_to_bytes(static_cast<uint32_t>(load_i32(values + 128 + 4 * i)));
      w[i] = _mm256_or_si256(w[i], _mm256_and_si256(has_high, sixteen));
    }
  }
}

// ---- AVX2: unsigned stored values times x (maddubs), pairs to int32 (madd), exact ---------------------------

// After a block's integer dots: acc += (d_w * d_x) * dot, then for Q4_1 acc += m_w * s_x (its min term).
template <X8Kind kKind>
SPECSWAP_X8_AVX2 inline __m256 add_block(__m256 acc, const uint8_t* block, __m256 ws, __m256i dot,
                                         const X8Activations& act, int64_t index) {
  acc = _mm256_fmadd_ps(_mm256_mul_ps(ws, _mm256_set1_ps(act.scales[index])), _mm256_cvtepi32_ps(dot), acc);
  if constexpr (kKind == X8Kind::kQ4_1) {
    const __m256 wm = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16)));
    acc = _mm256_fmadd_ps(wm, _mm256_set1_ps(act.mins[index]), acc);
  }
  return acc;
}

// A block's chunks as the AVX2 dot takes them (chunks_avx2).
struct Avx2Block {
  __m256i w[8];
};

template <X8Kind kKind>
SPECSWAP_X8_AVX2 inline void prepare(const uint8_t* block, Avx2Block* s) {
  chunks_avx2<kKind>(block, s->w);
}

// activation values 4i..4i+3 in every 32-bit lane
SPECSWAP_X8_AVX2 inline __m256i broadcast4(const int8_t* x, int i) { return _mm256_set1_epi32(load_i32(x + 4 * i)); }

// The exact integer dots of one activation block (32 values at x) with the block's eight rows.
template <X8Kind kKind>
SPECSWAP_X8_AVX2 inline __m256i row_dot(const Avx2Block& s, const int8_t* x, const X8Activations& act,
                                        int64_t index) {
  const __m256i ones = _mm256_set1_epi16(1);
  // stored values u <= 31 (Q5_0; Q4_1: 15) times x, |x| <= 127 (ggml's Q8 activations): a pair sum is at most
  // 2 * 31 * 127 = 7874, so four chunks' pair sums add exactly in int16 (Q4_1: all eight, at most 30480)
  __m256i s0 = _mm256_maddubs_epi16(s.w[0], broadcast4(x, 0)), s1 = _mm256_maddubs_epi16(s.w[4], broadcast4(x, 4));
  for (int i = 1; i < 4; ++i) {
    s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(s.w[i], broadcast4(x, i)));
    s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(s.w[i + 4], broadcast4(x, i + 4)));
  }
  if constexpr (kKind == X8Kind::kQ4_1) return _mm256_madd_epi16(_mm256_add_epi16(s0, s1), ones);
  // Q5_0: the stored value is value + 16, so the dot is dot(stored, x) - 16 * sum(x)
  const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones));
  return _mm256_sub_epi32(dot, _mm256_set1_epi32(value_bias(kKind) * act.sums[index]));
}

// ---- AVX-512 VNNI: the stored unsigned values times x in one instruction, from -bias * sum(x), exact ---------

// A block's chunks as the VNNI dot takes them: the stored unsigned values.
struct VnniBlock {
  __m256i u[8];
};

template <X8Kind kKind>
SPECSWAP_X8_VNNI inline void prepare(const uint8_t* block, VnniBlock* s) {
  chunks_unsigned<kKind>(block, s->u);
}

template <X8Kind kKind>
SPECSWAP_X8_VNNI inline __m256i row_dot(const VnniBlock& s, const int8_t* x, const X8Activations& act,
                                        int64_t index) {
  constexpr int32_t kBias = value_bias(kKind);
  __m256i s0 = kBias == 0 ? _mm256_setzero_si256() : _mm256_set1_epi32(-kBias * act.sums[index]);
  __m256i s1 = _mm256_setzero_si256();
  for (int i = 0; i < 8; i += 2) {
    s0 = dpbusd_broadcast(s0, s.u[i], x + 4 * i);
    s1 = dpbusd_broadcast(s1, s.u[i + 1], x + 4 * i + 4);
  }
  return _mm256_add_epi32(s0, s1);
}

// ---- the kernels: groups of 8 weight rows against kRows activation rows, one skeleton per instruction set ----

// out[r * stride + 8 (g - g0) + j] for groups [g0, g1) and activation rows [r0, r0 + kRows).
#define SPECSWAP_X8_ROWS(NAME, TARGET, BLOCK)                                                                    \
  template <X8Kind kKind, int kRows>                                                                           \
  TARGET void NAME(const uint8_t* packed, int64_t g0, int64_t g1, const X8Activations& act, int64_t r0,        \
                   int64_t blocks, float* out, int64_t stride) {                                               \
    constexpr size_t kBlockBytes = x8_block_bytes(kKind);                                                      \
    for (int64_t g = g0; g < g1; ++g) {                                                                        \
      const uint8_t* group = packed + g * blocks * kBlockBytes;                                                \
      __m256 acc[kRows];                                                                                       \
      for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();                                            \
      for (int64_t b = 0; b < blocks; ++b) {                                                                   \
        const uint8_t* block = group + b * kBlockBytes;                                                        \
        x8::prefetch_ahead<kBlockBytes>(block);                                                                \
        const __m256 ws = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));           \
        BLOCK chunks;                                                                                          \
        prepare<kKind>(block, &chunks);                                                                        \
        for (int r = 0; r < kRows; ++r) {                                                                      \
          const int64_t index = (r0 + r) * blocks + b;                                                         \
          const __m256i dot = row_dot<kKind>(chunks, act.qs + index * 32, act, index);                         \
          acc[r] = add_block<kKind>(acc[r], block, ws, dot, act, index);                                       \
        }                                                                                                      \
      }                                                                                                        \
      for (int r = 0; r < kRows; ++r) _mm256_storeu_ps(out + r * stride + (g - g0) * kX8Rows, acc[r]);         \
    }                                                                                                          \
  }

SPECSWAP_X8_ROWS(x8_rows_avx2, SPECSWAP_X8_AVX2, Avx2Block)
SPECSWAP_X8_ROWS(x8_rows_vnni, SPECSWAP_X8_VNNI, VnniBlock)
#undef SPECSWAP_X8_ROWS

// Q8_0 on AVX2, chunk by chunk: chunk i's values and their magnitudes are formed once and advance every
// activation row's exact int32 dot, so up to 4 rows' dots and float accumulators stay in AVX2's 16 registers
// (prepare + row_dot would hold the whole block's 16 vectors). The same integer dots and float operations as the
// other forms, so the same bits.
template <int kRows>
SPECSWAP_X8_AVX2 void q8_0_rows_avx2(const uint8_t* packed, int64_t g0, int64_t g1, const X8Activations& act,
                                     int64_t r0, int64_t blocks, float* out, int64_t stride) {
  constexpr size_t kBlockBytes = x8_block_bytes(X8Kind::kQ8_0);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = packed + g * blocks * kBlockBytes;
    __m256 acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = group + b * kBlockBytes;
      const uint8_t* values = block + header_bytes(X8Kind::kQ8_0);
      x8::prefetch_ahead<kBlockBytes>(block);
      __m256i dot[kRows];
      for (int r = 0; r < kRows; ++r) dot[r] = _mm256_setzero_si256();
      for (int i = 0; i < 8; ++i) {
        const __m256i w = _mm256_xor_si256(load256(values + 32 * i), bias), magnitude = _mm256_sign_epi8(w, w);
        for (int r = 0; r < kRows; ++r) {
          const __m256i x = _mm256_sign_epi8(broadcast4(act.qs + ((r0 + r) * blocks + b) * 32, i), w);
          dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, x), ones));
        }
      }
      const __m256 ws = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
      for (int r = 0; r < kRows; ++r) {
        acc[r] = add_block<X8Kind::kQ8_0>(acc[r], block, ws, dot[r], act, (r0 + r) * blocks + b);
      }
    }
    for (int r = 0; r < kRows; ++r) _mm256_storeu_ps(out + r * stride + (g - g0) * kX8Rows, acc[r]);
  }
}

template <X8Kind kKind>
void x8_gemm_simd(X8Path path, const uint8_t* packed, int64_t g0, int64_t g1, const X8Activations& act,
                  int64_t blocks, int64_t m, float* out, int64_t stride) {
  x8::in_row_passes(m, [&]<int kRows>(int64_t r0) {
    float* y = out + r0 * stride;
    if (path == X8Path::kVnni) {
      x8_rows_vnni<kKind, kRows>(packed, g0, g1, act, r0, blocks, y, stride);
    } else if constexpr (kKind == X8Kind::kQ8_0) {
      q8_0_rows_avx2<kRows>(packed, g0, g1, act, r0, blocks, y, stride);
    } else {
      x8_rows_avx2<kKind, kRows>(packed, g0, g1, act, r0, blocks, y, stride);
    }
  });
}

bool vnni512_supported() {
  __builtin_cpu_init();
  return vnni_supported() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}

}  // namespace

void repack_x8(X8Kind kind, const void* src, int64_t rows, int64_t blocks, uint8_t* dst) {
  if (x8_is_k(kind)) return repack_x8k(kind, src, rows, blocks, dst);
  const size_t block_bytes = x8_block_bytes(kind);
  std::memset(dst, 0, static_cast<size_t>(rows / kX8Rows * blocks) * block_bytes);
  for (int64_t g = 0; g < rows / kX8Rows; ++g) {
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* block = dst + (g * blocks + b) * block_bytes;
      for (int j = 0; j < kX8Rows; ++j) {
        const int64_t index = (g * kX8Rows + j) * blocks + b;
        uint16_t d = 0, min = 0;
        for (int v = 0; v < 32; ++v) {
          store(kind, block, v / 4, 4 * j + v % 4, plain_stored(kind, src, index, v, &d, &min));
        }
        std::memcpy(block + 2 * j, &d, sizeof(d));
        if (kind == X8Kind::kQ4_1) std::memcpy(block + 16 + 2 * j, &min, sizeof(min));
      }
    }
  }
}

void unpack_x8_row(X8Kind kind, const uint8_t* packed, int64_t row, int64_t blocks, void* dst) {
  if (x8_is_k(kind)) return unpack_x8k_row(kind, packed, row, blocks, dst);
  const size_t block_bytes = x8_block_bytes(kind);
  const int64_t g = row / kX8Rows;
  const int j = static_cast<int>(row % kX8Rows);
  std::memset(dst, 0, static_cast<size_t>(blocks) * block_bytes / kX8Rows);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = packed + (g * blocks + b) * block_bytes;
    uint16_t d, min = 0;
    std::memcpy(&d, block + 2 * j, sizeof(d));
    if (kind == X8Kind::kQ4_1) std::memcpy(&min, block + 16 + 2 * j, sizeof(min));
    for (int v = 0; v < 32; ++v) plain_store(kind, dst, b, v, stored(kind, block, v / 4, 4 * j + v % 4), d, min);
  }
}

void x8_act_prepare(bool q8_1, const void* act, int64_t blocks, int64_t m, int8_t* qs, float* scales, int32_t* sums,
                    float* mins) {
  for (int64_t i = 0; i < blocks * m; ++i) {
    const int8_t* values;
    if (q8_1) {
      const BlockQ8_1& block = static_cast<const BlockQ8_1*>(act)[i];
      scales[i] = half_to_float(block.d);
      mins[i] = half_to_float(block.s);
      values = block.qs;
    } else {
      const BlockQ8_0& block = static_cast<const BlockQ8_0*>(act)[i];
      scales[i] = half_to_float(block.d);
      values = block.qs;
    }
    std::memcpy(qs + i * 32, values, 32);
    int32_t sum = 0;
    for (int t = 0; t < 32; ++t) sum += values[t];
    sums[i] = sum;
  }
}

X8Path x8_best_path(bool allow_avx2, bool allow_vnni) {
  static const bool vnni = vnni512_supported(), avx2 = q8_kernels_supported();
  if (allow_avx2 && allow_vnni && vnni) return X8Path::kVnni;
  if (allow_avx2 && avx2) return X8Path::kAvx2;
  return X8Path::kScalar;
}

void x8_gemm(X8Kind kind, X8Path path, const uint8_t* packed, int64_t g0, int64_t g1, const X8Activations& act,
             int64_t blocks, int64_t m, float* out, int64_t out_stride) {
  if (path == X8Path::kScalar) {
    x8_gemm_scalar(kind, packed, g0, g1, act, blocks, m, out, out_stride);
  } else if (kind == X8Kind::kQ8_0) {
    x8_gemm_simd<X8Kind::kQ8_0>(path, packed, g0, g1, act, blocks, m, out, out_stride);
  } else if (kind == X8Kind::kQ5_0) {
    x8_gemm_simd<X8Kind::kQ5_0>(path, packed, g0, g1, act, blocks, m, out, out_stride);
  } else {
    x8_gemm_simd<X8Kind::kQ4_1>(path, packed, g0, g1, act, blocks, m, out, out_stride);
  }
}

}  // namespace specswap::quant
