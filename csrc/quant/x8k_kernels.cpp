// Q4_K and Q6_K weights interleaved by eight rows ("Q4_Kx8", "Q6_Kx8") and their multi-row kernels; the layouts
// and the arithmetic every path shares are in x8_kernels.h. Compiled with per-function target attributes and
// chosen at run time, as x8_kernels.cpp.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "quant/x8_common.h"
#include "quant/x8_kernels.h"

namespace specswap::quant {
namespace {

using x8::dpbusd_broadcast, x8::half_to_float, x8::load256, x8::load_i32, x8::nibbles, x8::set_nibble;

#define SPECSWAP_X8K_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SPECSWAP_X8K_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

// Q4_Kx8 block offsets: d, dmin, the scales' and mins' low nibbles, their high bits, the values
constexpr size_t kQ4kMins = 16, kQ4kLow = 32, kQ4kHigh = 96, kQ4kValues = 128;
// Q6_Kx8: d, scales, the values' low 4 bits, their high 2 bits
constexpr size_t kQ6kScales = 16, kQ6kLow = 144, kQ6kHigh = 1168;
static_assert(kQ4kValues + 1024 == 8 * sizeof(BlockQ4_K) && kQ6kHigh + 512 == 8 * sizeof(BlockQ6_K));

// ---- one row of a block, unpacked: what both the plain blocks and the layout hold ----------------------------

struct KRow {
  uint16_t d = 0, dmin = 0;
  uint8_t q[256] = {};     // stored values: Q4_K 0..15, Q6_K 0..63 (value + 32)
  uint8_t scale[16] = {};  // Q4_K: 8 six-bit scales; Q6_K: 16 int8 scales (as bytes)
  uint8_t min[8] = {};     // Q4_K's six-bit mins
};

// ggml's get_scale_min_k4 and its inverse
void q4k_scales(const uint8_t* s, KRow* row) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      row->scale[j] = s[j] & 63;
      row->min[j] = s[j + 4] & 63;
    } else {
      row->scale[j] = static_cast<uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
      row->min[j] = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
  }
}

void q4k_pack_scales(const KRow& row, uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] |= row.scale[j] & 63;
      s[j + 4] |= row.min[j] & 63;
    } else {
      s[j + 4] = static_cast<uint8_t>((row.scale[j] & 0xF) | ((row.min[j] & 0xF) << 4));
      s[j - 4] |= static_cast<uint8_t>((row.scale[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((row.min[j] >> 4) << 6);
    }
  }
}

void plain_to_row(X8Kind kind, const void* block, KRow* row) {
  if (kind == X8Kind::kQ4_K) {
    const BlockQ4_K& b = *static_cast<const BlockQ4_K*>(block);
    row->d = b.d;
    row->dmin = b.dmin;
    q4k_scales(b.scales, row);
    for (int v = 0; v < 256; ++v) {  // qs[32t + l]: value 64t + l in the low nibble, 64t + 32 + l in the high one
      const uint8_t byte = b.qs[32 * (v / 64) + v % 32];
      row->q[v] = (v % 64) < 32 ? (byte & 0x0F) : (byte >> 4);
    }
    return;
  }
  const BlockQ6_K& b = *static_cast<const BlockQ6_K*>(block);
  row->d = b.d;
  std::memcpy(row->scale, b.scales, 16);
  for (int v = 0; v < 256; ++v) {  // half h = v / 128; quarter c of it and l = v % 32 (ggml's dequantize_row_q6_K)
    const int h = v / 128, c = (v % 128) / 32, l = v % 32;
    const uint8_t low = b.ql[64 * h + l + 32 * (c % 2)];
    const uint8_t nibble = c < 2 ? (low & 0x0F) : (low >> 4);
    row->q[v] = static_cast<uint8_t>(nibble | (((b.qh[32 * h + l] >> (2 * c)) & 3) << 4));
  }
}

void row_to_plain(X8Kind kind, const KRow& row, void* block) {
  if (kind == X8Kind::kQ4_K) {
    BlockQ4_K& b = *static_cast<BlockQ4_K*>(block);
    b.d = row.d;
    b.dmin = row.dmin;
    q4k_pack_scales(row, b.scales);
    std::memset(b.qs, 0, sizeof(b.qs));
    for (int v = 0; v < 256; ++v) b.qs[32 * (v / 64) + v % 32] |= static_cast<uint8_t>(row.q[v] << ((v % 64) < 32 ? 0 : 4));
    return;
  }
  BlockQ6_K& b = *static_cast<BlockQ6_K*>(block);
  b.d = row.d;
  std::memcpy(b.scales, row.scale, 16);
  std::memset(b.ql, 0, sizeof(b.ql));
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int v = 0; v < 256; ++v) {
    const int h = v / 128, c = (v % 128) / 32, l = v % 32;
    b.ql[64 * h + l + 32 * (c % 2)] |= static_cast<uint8_t>((row.q[v] & 0x0F) << (c < 2 ? 0 : 4));
    b.qh[32 * h + l] |= static_cast<uint8_t>((row.q[v] >> 4) << (2 * c));
  }
}

// ---- the layout: where row p's parts live in a block of 8 rows ------------------------------------------------

// Value v of row p: 32-value group G = v / 32, chunk i = (v % 32) / 4 of it, byte 4p + v % 4 of the chunk; the
// chunk's 4-bit parts sit in vector i % 4 of the group (low nibbles for i < 4, high for i >= 4), as Q4_1x8.
size_t nibble_byte(int v, int p) { return 128 * (v / 32) + 32 * ((v % 32 / 4) % 4) + 4 * p + v % 4; }
bool nibble_high(int v) { return (v % 32) / 4 >= 4; }
// Q6_Kx8's high 2 bits of chunk i: vector i % 2 of the group's two, bits 2 (i / 2) and up
size_t crumb_byte(int v, int p) { return 64 * (v / 32) + 32 * ((v % 32 / 4) % 2) + 4 * p + v % 4; }
int crumb_shift(int v) { return 2 * ((v % 32 / 4) / 2); }
// Q4_Kx8's scale of sub-block j for row p is entry 8j + p of the scale order, its min entry 16 (j / 2) + 2p + j % 2
// of the min order (int16 pairs of sub-blocks 2t, 2t + 1 per row: what one madd against two sums takes)
int scale_entry(int j, int p) { return 8 * j + p; }
int min_entry(int j, int p) { return 16 * (j / 2) + 2 * p + j % 2; }

uint8_t get_nibble(const uint8_t* base, size_t byte, bool high) { return high ? base[byte] >> 4 : base[byte] & 0x0F; }
void put_nibble(uint8_t* base, size_t byte, bool high, uint8_t value) { set_nibble(base[byte], high, value); }
// the 2-bit field at bits [2 * part, 2 * part + 2) of the high-bits nibble of entry e (entries 32.. in high nibbles)
uint8_t get_high2(const uint8_t* high, int e, int part) {
  return static_cast<uint8_t>((get_nibble(high, e % 32, e >= 32) >> (2 * part)) & 3);
}
void put_high2(uint8_t* high, int e, int part, uint8_t value) {
  uint8_t nibble = get_nibble(high, e % 32, e >= 32);
  nibble = static_cast<uint8_t>((nibble & ~(3 << (2 * part))) | ((value & 3) << (2 * part)));
  put_nibble(high, e % 32, e >= 32, nibble);
}

void layout_get(X8Kind kind, const uint8_t* block, int p, KRow* row) {
  std::memcpy(&row->d, block + 2 * p, 2);
  if (kind == X8Kind::kQ4_K) {
    std::memcpy(&row->dmin, block + kQ4kMins + 2 * p, 2);
    for (int j = 0; j < 8; ++j) {
      const int es = scale_entry(j, p), em = min_entry(j, p);
      row->scale[j] = static_cast<uint8_t>(get_nibble(block + kQ4kLow, es, false) | (get_high2(block + kQ4kHigh, es, 0) << 4));
      row->min[j] = static_cast<uint8_t>(get_nibble(block + kQ4kLow, em, true) | (get_high2(block + kQ4kHigh, em, 1) << 4));
    }
    for (int v = 0; v < 256; ++v) row->q[v] = get_nibble(block + kQ4kValues, nibble_byte(v, p), nibble_high(v));
    return;
  }
  for (int g = 0; g < 16; ++g) row->scale[g] = block[kQ6kScales + 8 * g + p];
  for (int v = 0; v < 256; ++v) {
    const uint8_t high = (block[kQ6kHigh + crumb_byte(v, p)] >> crumb_shift(v)) & 3;
    row->q[v] = static_cast<uint8_t>(get_nibble(block + kQ6kLow, nibble_byte(v, p), nibble_high(v)) | (high << 4));
  }
}

void layout_put(X8Kind kind, uint8_t* block, int p, const KRow& row) {
  std::memcpy(block + 2 * p, &row.d, 2);
  if (kind == X8Kind::kQ4_K) {
    std::memcpy(block + kQ4kMins + 2 * p, &row.dmin, 2);
    for (int j = 0; j < 8; ++j) {
      const int es = scale_entry(j, p), em = min_entry(j, p);
      put_nibble(block + kQ4kLow, es, false, row.scale[j]);
      put_high2(block + kQ4kHigh, es, 0, row.scale[j] >> 4);
      put_nibble(block + kQ4kLow, em, true, row.min[j]);
      put_high2(block + kQ4kHigh, em, 1, row.min[j] >> 4);
    }
    for (int v = 0; v < 256; ++v) put_nibble(block + kQ4kValues, nibble_byte(v, p), nibble_high(v), row.q[v]);
    return;
  }
  for (int g = 0; g < 16; ++g) block[kQ6kScales + 8 * g + p] = row.scale[g];
  for (int v = 0; v < 256; ++v) {
    put_nibble(block + kQ6kLow, nibble_byte(v, p), nibble_high(v), row.q[v]);
    uint8_t& crumbs = block[kQ6kHigh + crumb_byte(v, p)];
    crumbs = static_cast<uint8_t>((crumbs & ~(3 << crumb_shift(v))) | (((row.q[v] >> 4) & 3) << crumb_shift(v)));
  }
}

// ---- scalar: the reference every SIMD path equals bit for bit ----------------------------------------------

// The exact integer parts of one (weight row, activation block): isum = sum_j scale_j * dot_j over the stored
// values (Q6_K: of value - 32), imin = sum_j min_j * (sum of sub-block j's 32 activation values) (Q4_K).
void row_ints(X8Kind kind, const KRow& w, const BlockQ8_K& x, int32_t* isum, int32_t* imin) {
  int32_t total = 0, mins = 0;
  if (kind == X8Kind::kQ4_K) {
    for (int j = 0; j < 8; ++j) {
      int32_t dot = 0;
      for (int v = 32 * j; v < 32 * j + 32; ++v) dot += static_cast<int32_t>(w.q[v]) * x.qs[v];
      total += static_cast<int32_t>(w.scale[j]) * dot;
      mins += static_cast<int32_t>(w.min[j]) * (x.bsums[2 * j] + x.bsums[2 * j + 1]);
    }
  } else {
    for (int g = 0; g < 16; ++g) {
      int32_t dot = 0;
      for (int v = 16 * g; v < 16 * g + 16; ++v) dot += (static_cast<int32_t>(w.q[v]) - 32) * x.qs[v];
      total += static_cast<int32_t>(static_cast<int8_t>(w.scale[g])) * dot;
    }
  }
  *isum = total;
  *imin = mins;
}

void gemm_scalar(X8Kind kind, const uint8_t* packed, int64_t g0, int64_t g1, const BlockQ8_K* act, int64_t blocks,
                 int64_t m, float* out, int64_t stride) {
  const size_t block_bytes = x8_block_bytes(kind);
  KRow w;
  for (int64_t g = g0; g < g1; ++g) {
    for (int j = 0; j < kX8Rows; ++j) {
      for (int64_t r = 0; r < m; ++r) {
        float acc = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          layout_get(kind, packed + (g * blocks + b) * block_bytes, j, &w);
          const BlockQ8_K& x = act[r * blocks + b];
          int32_t isum, imin;
          row_ints(kind, w, x, &isum, &imin);
          acc = std::fma(half_to_float(w.d) * x.d, static_cast<float>(isum), acc);
          if (kind == X8Kind::kQ4_K) acc = std::fma(-(half_to_float(w.dmin) * x.d), static_cast<float>(imin), acc);
        }
        out[r * stride + (g - g0) * kX8Rows + j] = acc;
      }
    }
  }
}

// ---- SIMD: a group's block unpacked once, then every activation row ------------------------------------------

// Q6_Kx8: a group's 8 chunks of stored values 0..63 (low 4 bits | high 2 bits << 4)
SPECSWAP_X8K_AVX2 inline void six_bit(const uint8_t* block, int group, __m256i* q) {
  nibbles(block + kQ6kLow + 128 * group, q);
  const __m256i three = _mm256_set1_epi8(3);
  const __m256i h[2] = {load256(block + kQ6kHigh + 64 * group), load256(block + kQ6kHigh + 64 * group + 32)};
  for (int i = 0; i < 8; ++i) {
    // bits 2 (i / 2) of vector i % 2 to bits 4..5: shift within 16-bit lanes, the mask keeps each byte's own bits
    const __m256i crumb = _mm256_and_si256(_mm256_srli_epi16(h[i % 2], 2 * (i / 2)), three);
    q[i] = _mm256_or_si256(q[i], _mm256_slli_epi16(crumb, 4));
  }
}

// Q4_Kx8: the 64 scales (scale order) into `scales`, and the mins as 4 vectors of int16 pairs
SPECSWAP_X8K_AVX2 inline void q4k_scales_mins(const uint8_t* block, uint8_t* scales, __m256i* mins) {
  const __m256i four = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
  const __m256i low0 = load256(block + kQ4kLow), low1 = load256(block + kQ4kLow + 32);
  const __m256i high = load256(block + kQ4kHigh);
  const __m256i high_lo = _mm256_and_si256(high, four), high_hi = _mm256_and_si256(_mm256_srli_epi16(high, 4), four);
  const __m256i s0 = _mm256_or_si256(_mm256_and_si256(low0, four), _mm256_slli_epi16(_mm256_and_si256(high_lo, three), 4));
  const __m256i s1 = _mm256_or_si256(_mm256_and_si256(low1, four), _mm256_slli_epi16(_mm256_and_si256(high_hi, three), 4));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(scales), s0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(scales + 32), s1);
  const __m256i m0 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low0, 4), four),
                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high_lo, 2), three), 4));
  const __m256i m1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low1, 4), four),
                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high_hi, 2), three), 4));
  mins[0] = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(m0));
  mins[1] = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(m0, 1));
  mins[2] = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(m1));
  mins[3] = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(m1, 1));
}

// eight bytes at p as int32 lanes, unsigned (Q4_K's scales) or signed (Q6_K's)
SPECSWAP_X8K_AVX2 inline __m256i widen_u8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
SPECSWAP_X8K_AVX2 inline __m256i widen_i8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// Q4_K's min term of one activation block against the 8 rows: sum_j min_j * s_j, s_j the sum of sub-block j's
// 32 values, as 4 madds of the rows' (min_2t, min_2t+1) pairs with (s_2t, s_2t+1)
SPECSWAP_X8K_AVX2 inline __m256i q4k_min_term(const __m256i* mins, const BlockQ8_K& x) {
  __m256i total = _mm256_setzero_si256();
  for (int t = 0; t < 4; ++t) {
    const int32_t pair = static_cast<int32_t>(static_cast<uint16_t>(x.bsums[4 * t] + x.bsums[4 * t + 1])) |
                         static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(x.bsums[4 * t + 2] + x.bsums[4 * t + 3])) << 16);
    total = _mm256_add_epi32(total, _mm256_madd_epi16(mins[t], _mm256_set1_epi32(pair)));
  }
  return total;
}

// One sub-block's exact integer dot with the 8 rows, times their scales: Q4_K sub-block G (chunks u[0..8), x the
// 32 activation values at qs + 32 G), Q6_K sub-block g = 2 G + half (chunks u[4 half..4 half + 4), 16 values at
// qs + 16 g, minus 32 * sum(x) for the stored value + 32).
// AVX2: unsigned weights times signed x (maddubs). Stored values are <= 15 (Q4_K) or <= 63 (Q6_K) and |x| <= 128,
// so a pair sum is at most 16128: Q4_K's eight chunks add exactly in int16 (at most 30720), Q6_K's two at a time;
// madd by the scale (held twice per int32 lane) takes them to int32.
SPECSWAP_X8K_AVX2 inline __m256i pairs(__m256i u, const int8_t* x) {
  return _mm256_maddubs_epi16(u, _mm256_set1_epi32(load_i32(x)));
}

// int32 lanes (|value| < 2^15) as int16 pairs holding the value twice
SPECSWAP_X8K_AVX2 inline __m256i twice16(__m256i v) {
  const __m256i low = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
  return _mm256_or_si256(low, _mm256_slli_epi32(v, 16));
}

template <X8Kind kKind>
SPECSWAP_X8K_AVX2 inline __m256i scaled_dot_avx2(const __m256i* u, int half, const BlockQ8_K& x, int G, __m256i scale) {
  const __m256i scale16 = twice16(scale);
  if constexpr (kKind == X8Kind::kQ4_K) {
    const int8_t* v = x.qs + 32 * G;
    __m256i s = pairs(u[0], v);
    for (int i = 1; i < 8; ++i) s = _mm256_add_epi16(s, pairs(u[i], v + 4 * i));
    return _mm256_madd_epi16(s, scale16);
  } else {
    const int g = 2 * G + half;
    const int8_t* v = x.qs + 16 * g;
    const __m256i* c = u + 4 * half;
    const __m256i a = _mm256_add_epi16(pairs(c[0], v), pairs(c[1], v + 4));
    const __m256i b = _mm256_add_epi16(pairs(c[2], v + 8), pairs(c[3], v + 12));
    const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(a, scale16), _mm256_madd_epi16(b, scale16));
    return _mm256_sub_epi32(dot, _mm256_mullo_epi32(scale, _mm256_set1_epi32(32 * x.bsums[g])));
  }
}

template <X8Kind kKind>
SPECSWAP_X8K_VNNI inline __m256i scaled_dot_vnni(const __m256i* u, int half, const BlockQ8_K& x, int G, __m256i scale) {
  if constexpr (kKind == X8Kind::kQ4_K) {
    const int8_t* v = x.qs + 32 * G;
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int i = 0; i < 8; i += 2) {
      s0 = dpbusd_broadcast(s0, u[i], v + 4 * i);
      s1 = dpbusd_broadcast(s1, u[i + 1], v + 4 * i + 4);
    }
    return _mm256_mullo_epi32(_mm256_add_epi32(s0, s1), scale);
  } else {
    const int g = 2 * G + half;
    const int8_t* v = x.qs + 16 * g;
    const __m256i* c = u + 4 * half;
    __m256i s0 = _mm256_set1_epi32(-32 * x.bsums[g]), s1 = _mm256_setzero_si256();
    s0 = dpbusd_broadcast(s0, c[0], v);
    s1 = dpbusd_broadcast(s1, c[1], v + 4);
    s0 = dpbusd_broadcast(s0, c[2], v + 8);
    s1 = dpbusd_broadcast(s1, c[3], v + 12);
    return _mm256_mullo_epi32(_mm256_add_epi32(s0, s1), scale);
  }
}

// Groups [g0, g1) of 8 weight rows against activation rows [r0, r0 + kRows): out[r * stride + 8 (g - g0) + j].
// Per block: its scales (and Q4_K's mins) unpacked once, then per 32-value group its chunks once and every
// activation row's scaled dots into an exact int32 sum per row; then per row the float work, shared by 8 rows.
#define SPECSWAP_X8K_ROWS(NAME, TARGET, DOT)                                                                       \
  template <X8Kind kKind, int kRows>                                                                             \
  TARGET void NAME(const uint8_t* packed, int64_t g0, int64_t g1, const BlockQ8_K* act, int64_t r0,             \
                   int64_t blocks, float* out, int64_t stride) {                                                 \
    constexpr size_t kBlockBytes = x8_block_bytes(kKind);                                                        \
    constexpr int kHalves = kKind == X8Kind::kQ4_K ? 1 : 2;                                                      \
    alignas(32) uint8_t scales[64];                                                                              \
    for (int64_t g = g0; g < g1; ++g) {                                                                          \
      const uint8_t* group = packed + g * blocks * kBlockBytes;                                                  \
      __m256 acc[kRows];                                                                                         \
      for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();                                              \
      for (int64_t b = 0; b < blocks; ++b) {                                                                     \
        const uint8_t* block = group + b * kBlockBytes;                                                          \
        x8::prefetch_ahead<kBlockBytes>(block);                                                                  \
        const BlockQ8_K* x = act + r0 * blocks + b;                                                              \
        __m256i isum[kRows], mins[4], u[8];                                                                      \
        for (int r = 0; r < kRows; ++r) isum[r] = _mm256_setzero_si256();                                        \
        if constexpr (kKind == X8Kind::kQ4_K) q4k_scales_mins(block, scales, mins);                              \
        for (int G = 0; G < 8; ++G) {                                                                            \
          if constexpr (kKind == X8Kind::kQ4_K) {                                                                \
            nibbles(block + kQ4kValues + 128 * G, u);                                                            \
          } else {                                                                                               \
            six_bit(block, G, u);                                                                                \
          }                                                                                                      \
          for (int half = 0; half < kHalves; ++half) {                                                           \
            const __m256i scale = kKind == X8Kind::kQ4_K ? widen_u8(scales + 8 * G)                               \
                                                         : widen_i8(block + kQ6kScales + 8 * (2 * G + half));     \
            for (int r = 0; r < kRows; ++r) {                                                                    \
              isum[r] = _mm256_add_epi32(isum[r], DOT<kKind>(u, half, x[r * blocks], G, scale));                 \
            }                                                                                                    \
          }                                                                                                      \
        }                                                                                                        \
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));             \
        [[maybe_unused]] const __m256 dmin = kKind == X8Kind::kQ4_K                                              \
            ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ4kMins)))              \
            : _mm256_setzero_ps();                                                                               \
        for (int r = 0; r < kRows; ++r) {                                                                        \
          const __m256 dx = _mm256_set1_ps(x[r * blocks].d);                                                     \
          acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum[r]), acc[r]);                  \
          if constexpr (kKind == X8Kind::kQ4_K) {                                                                \
            acc[r] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(q4k_min_term(mins, x[r * blocks])), \
                                      acc[r]);                                                                   \
          }                                                                                                      \
        }                                                                                                        \
      }                                                                                                          \
      for (int r = 0; r < kRows; ++r) _mm256_storeu_ps(out + r * stride + (g - g0) * kX8Rows, acc[r]);           \
    }                                                                                                            \
  }

SPECSWAP_X8K_ROWS(rows_avx2, SPECSWAP_X8K_AVX2, scaled_dot_avx2)
SPECSWAP_X8K_ROWS(rows_vnni, SPECSWAP_X8K_VNNI, scaled_dot_vnni)
#undef SPECSWAP_X8K_ROWS

template <X8Kind kKind>
void gemm_simd(X8Path path, const uint8_t* packed, int64_t g0, int64_t g1, const BlockQ8_K* act, int64_t blocks,
               int64_t m, float* out, int64_t stride) {
  x8::in_row_passes(m, [&]<int kRows>(int64_t r0) {
    float* y = out + r0 * stride;
    if (path == X8Path::kVnni) {
      rows_vnni<kKind, kRows>(packed, g0, g1, act, r0, blocks, y, stride);
    } else {
      rows_avx2<kKind, kRows>(packed, g0, g1, act, r0, blocks, y, stride);
    }
  });
}

}  // namespace

void repack_x8k(X8Kind kind, const void* src, int64_t rows, int64_t blocks, uint8_t* dst) {
  const size_t block_bytes = x8_block_bytes(kind), plain_bytes = block_bytes / kX8Rows;
  std::memset(dst, 0, static_cast<size_t>(rows / kX8Rows * blocks) * block_bytes);
  KRow row;
  for (int64_t g = 0; g < rows / kX8Rows; ++g) {
    for (int64_t b = 0; b < blocks; ++b) {
      for (int j = 0; j < kX8Rows; ++j) {
        plain_to_row(kind, static_cast<const uint8_t*>(src) + ((g * kX8Rows + j) * blocks + b) * plain_bytes, &row);
        layout_put(kind, dst + (g * blocks + b) * block_bytes, j, row);
      }
    }
  }
}

void unpack_x8k_row(X8Kind kind, const uint8_t* packed, int64_t row, int64_t blocks, void* dst) {
  const size_t block_bytes = x8_block_bytes(kind), plain_bytes = block_bytes / kX8Rows;
  KRow values;
  for (int64_t b = 0; b < blocks; ++b) {
    layout_get(kind, packed + ((row / kX8Rows) * blocks + b) * block_bytes, static_cast<int>(row % kX8Rows), &values);
    row_to_plain(kind, values, static_cast<uint8_t*>(dst) + b * plain_bytes);
  }
}

void x8k_gemm(X8Kind kind, X8Path path, const uint8_t* packed, int64_t g0, int64_t g1, const BlockQ8_K* act,
              int64_t blocks, int64_t m, float* out, int64_t out_stride) {
  if (path == X8Path::kScalar) {
    gemm_scalar(kind, packed, g0, g1, act, blocks, m, out, out_stride);
  } else if (kind == X8Kind::kQ4_K) {
    gemm_simd<X8Kind::kQ4_K>(path, packed, g0, g1, act, blocks, m, out, out_stride);
  } else {
    gemm_simd<X8Kind::kQ6_K>(path, packed, g0, g1, act, blocks, m, out, out_stride);
  }
}

}  // namespace specswap::quant
