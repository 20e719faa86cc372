// What the interleaved kernel files (x8_kernels.cpp, x8k_kernels.cpp) share: the exact half-to-float, a nibble
// setter, unaligned loads, a 32-value group's 4-bit parts, and VNNI's dot with an embedded broadcast.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace specswap::quant::x8 {

// IEEE half to float, exact (every half is a float), without F16C: the scalar kernels run on any CPU
inline float half_to_float(uint16_t h) {
  const uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), static_cast<int>(exponent) - 25);
  }
  return (h & 0x8000) ? -magnitude : magnitude;
}

// the low (`high` false) or high nibble of a byte set to the low 4 bits of `value`
inline void set_nibble(uint8_t& byte, bool high, uint8_t value) {
  byte = high ? static_cast<uint8_t>((byte & 0x0F) | ((value & 0x0F) << 4))
              : static_cast<uint8_t>((byte & 0xF0) | (value & 0x0F));
}

inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

__attribute__((target("avx2"))) inline __m256i load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// A 32-value group's 8 chunks of 4-bit parts: vector t of the 4 at `values` holds chunk t in its low nibbles and
// chunk t + 4 in its high ones.
__attribute__((target("avx2"))) inline void nibbles(const uint8_t* values, __m256i* q) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int t = 0; t < 4; ++t) {
    const __m256i v = load256(values + 32 * t);
    q[t] = _mm256_and_si256(v, low);
    q[t + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
  }
}

// acc + the dot of u's bytes with the 4 signed bytes at x, broadcast to every lane. One instruction with an
// embedded broadcast ({1to8}) of its memory operand: GCC emits a separate broadcast for
// _mm256_dpbusd_epi32(acc, u, _mm256_set1_epi32(load)), which cost the 8-row LM head a fifth of its time.
__attribute__((target("avx2,avx512f,avx512vl,avx512vnni"))) inline __m256i dpbusd_broadcast(__m256i acc, __m256i u,
                                                                                            const int8_t* x) {
  asm("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t*>(x)));
  return acc;
}

// Software prefetch of a block's bytes kPrefetchDistance ahead of it, into L1. The kernels stream each weight
// tensor once per call, and on one core the hardware prefetcher alone can leave the loads exposed
// (bench/bench_qlinear.py measures the LM head per row count). A prefetch is a hint that never faults, so
// addresses past a tensor's end are harmless; the address is formed as an integer for that reason.
constexpr uintptr_t kPrefetchDistance = 4096;
template <size_t kBytes>
inline void prefetch_ahead(const uint8_t* block) {
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(block) + kPrefetchDistance;
  for (size_t line = 0; line < kBytes; line += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + line), _MM_HINT_T0);
}

// Activation rows [0, m) in passes of up to 8, each a call of pass.template operator()<R>(r0) with R its row count
// as a constant, so the kernel keeps R rows' accumulators in registers.
template <typename Pass>
inline void in_row_passes(int64_t m, Pass&& pass) {
  for (int64_t r0 = 0; r0 < m; r0 += 8) {
    switch (m - r0 < 8 ? m - r0 : 8) {
      case 8: pass.template operator()<8>(r0); break;
      case 7: pass.template operator()<7>(r0); break;
      case 6: pass.template operator()<6>(r0); break;
      case 5: pass.template operator()<5>(r0); break;
      case 4: pass.template operator()<4>(r0); break;
      case 3: pass.template operator()<3>(r0); break;
      case 2: pass.template operator()<2>(r0); break;
      default: pass.template operator()<1>(r0); break;
    }
  }
}

}  // namespace specswap::quant::x8
