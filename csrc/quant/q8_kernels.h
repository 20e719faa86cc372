// Multi-row dot products for weight blocks whose activation type is Q8_0 (weights Q8_0, Q5_0, Q4_0), AVX2.
//
// ggml's vec_dot computes one weight row against one activation row, unpacking the weight block every time.
// Verifying k + 1 tokens dots every weight row with k + 1 activation rows, so here each weight block is
// unpacked once and dotted with up to four rows at a time. Every row's arithmetic is the same whatever the
// group it is computed in (blocks in order, one fused multiply-add per block, one fixed horizontal sum), so
// the output is batch-invariant by construction.
#pragma once

#include <cstddef>
#include <cstdint>

namespace specswap::quant {

// the block layouts (ggml.h / ggml-common.h, stable across GGUF versions)
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };               // 34 bytes: d * qs
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };  // 22 bytes: d * ((nibble | high bit << 4) - 16)
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };              // 18 bytes: d * (nibble - 8)
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ5_0) == 22 && sizeof(BlockQ4_0) == 18);

enum class Q8Weight { kQ8_0, kQ5_0, kQ4_0 };

// Whether this CPU can run the kernels (AVX2, FMA, F16C); the caller falls back to ggml's vec_dot otherwise.
bool q8_kernels_supported();

// out[r * out_stride + n] = dot(weight row n, activation row r) for n in [n0, n1), r in [0, m).
// weight: rows of `blocks` blocks of `kind`; act: m rows of `blocks` Q8_0 blocks each.
void q8_gemm_rows(Q8Weight kind, const uint8_t* weight, size_t weight_row_bytes, int64_t n0, int64_t n1,
                  const BlockQ8_0* act, int64_t blocks, int64_t m, float* out, int64_t out_stride);

}  // namespace specswap::quant
