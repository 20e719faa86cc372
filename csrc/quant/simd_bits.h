// The bits of a 32-bit word as bytes, for unpacking Q5_0's fifth bits (q8_kernels.cpp, x8_kernels.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace specswap::quant {

// Byte p of the result is 0xFF where bit p of `bits` is set, else 0 (AVX2): broadcast the word, spread source
// byte p / 8 over lanes 8 (p / 8) .. 8 (p / 8) + 7, and test one bit per lane.
__attribute__((target("avx2"))) inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

}  // namespace specswap::quant
