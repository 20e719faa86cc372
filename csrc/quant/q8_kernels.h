// Multi-row dot products over GGUF weight blocks, AVX2 (with AVX-512 VNNI where the CPU has it).
//
// ggml's vec_dot computes one weight row against one activation row, unpacking the weight block every time.
// Verifying k + 1 tokens dots every weight row with k + 1 activation rows, so here each weight block is
// unpacked once and dotted with up to eight rows at a time. Every row's arithmetic is the same whatever the
// group it is computed in (blocks in order, the same integer dot and float operations per block, one fixed
// horizontal sum), so the output is batch-invariant by construction.
//
// Q8_0 / Q5_0 / Q4_0 (activations Q8_0) and Q4_1 (activations Q8_1): the same float operations in the same order
// as ggml's AVX2 vec_dot, so the bits equal it; the VNNI variant computes the same exact integer dots in one
// instruction.
// Q4_K / Q6_K (activations Q8_K): each super-block's dot is exact in int32 and scaled once; the bits differ
// from ggml's vec_dot in the last places (its float order differs), never from row to row.
#pragma once

#include <cstddef>
#include <cstdint>

namespace specswap::quant {

// the block layouts (ggml-common.h, stable across GGUF versions)
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };               // 34 bytes: d * qs
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };  // 22 bytes: d * ((nibble | high bit << 4) - 16)
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };              // 18 bytes: d * (nibble - 8)
struct BlockQ8_K { float d; int8_t qs[256]; int16_t bsums[16]; };  // 292 bytes: d * qs, bsums of 16 values each
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };  // 20 bytes: d * nibble + m
struct BlockQ8_1 { uint16_t d; uint16_t s; int8_t qs[32]; };   // 36 bytes: d * qs; s = d * sum(qs)
// 144 bytes: 8 sub-blocks of 32, d * scale_j * nibble - dmin * min_j, scales and mins 6-bit packed
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[128]; };
// 210 bytes: 16 groups of 16, d * scale_g * (6-bit value - 32); low 4 bits in ql, high 2 in qh
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ5_0) == 22 && sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ8_K) == 292 && sizeof(BlockQ4_K) == 144 && sizeof(BlockQ6_K) == 210);

enum class QWeight { kQ8_0, kQ5_0, kQ4_0, kQ4_1, kQ4_K, kQ6_K };

// K-quants take Q8_K activations (256 values a block); the others Q8_0 (32 values a block).
constexpr bool is_k_quant(QWeight kind) { return kind == QWeight::kQ4_K || kind == QWeight::kQ6_K; }
constexpr int64_t block_values(QWeight kind) { return is_k_quant(kind) ? 256 : 32; }

// Whether this CPU can run the kernels (AVX2, FMA, F16C); the caller falls back to ggml's vec_dot otherwise.
bool q8_kernels_supported();
// Whether it also has AVX-512 VNNI with VL (one instruction for the Q8_0-family integer dot).
bool vnni_supported();

// Q8_0-family activations: each row's block scales as fp32, scales[r * blocks + b] (once per call, not per
// weight row). Unused for K-quants (their activation scale is fp32 already).
void act_block_scales(const BlockQ8_0* act, int64_t blocks, int64_t m, float* scales);
// Q4_1's Q8_1 activations: per row its block scales then its block sums, scales[r * 2 * blocks + {0, blocks} + b].
void act_block_scales_q8_1(const BlockQ8_1* act, int64_t blocks, int64_t m, float* scales);
// floats act_*_scales writes for m rows of `blocks` blocks of activations for `kind`
constexpr int64_t act_scale_count(QWeight kind, int64_t blocks, int64_t m) {
  return kind == QWeight::kQ4_1 ? 2 * blocks * m : blocks * m;
}

// out[r * out_stride + n] = dot(weight row n, activation row r) for n in [n0, n1), r in [0, m).
// weight: rows of `blocks` blocks of `kind`; act: m rows of `blocks` activation blocks (Q8_0 or Q8_K);
// scales: act_block_scales' output (Q8_0 family only); vnni: use the VNNI variant (vnni_supported() only).
void q8_gemm_rows(QWeight kind, const uint8_t* weight, size_t weight_row_bytes, int64_t n0, int64_t n1,
                  const void* act, const float* scales, int64_t blocks, int64_t m, float* out, int64_t out_stride,
                  bool vnni);

}  // namespace specswap::quant
