// Q8_0, Q5_0, Q4_1, Q4_K and Q6_K weights interleaved by eight rows ("Q8_0x8", "Q5_0x8", "Q4_1x8", "Q4_Kx8",
// "Q6_Kx8"), repacked once at load time, and their multi-row kernels.
//
// A plain block-format kernel computes one weight row against one activation row per block: an integer dot into
// eight lanes, then a float scale, multiply-add and (at the end) a horizontal sum, all per (weight row, activation
// row, block). Interleaved, one 32-byte chunk holds four values of eight weight rows, so one integer dot
// instruction against four broadcast activation values advances eight weight rows at once, and the float work
// (one convert, scale, multiply-add) is shared by those eight rows: per activation row and block it is one
// eighth of the plain kernel's. Verifying k + 1 tokens then costs much less than k + 1 single-row passes.
//
// Layout, per group of 8 weight rows and per block b of 32 values: 8 fp16 scales (rows 0..7; Q4_1: then its 8
// fp16 mins), then the values as 8 chunks; chunk i holds values 4i..4i+3 of rows 0..7 in row order (byte p: row p / 4, value 4i + p % 4).
//   Q8_0x8: chunk i is 32 bytes of value + 128. 272 bytes, the 8 rows' Q8_0 bytes.
//   Q5_0x8: the 5-bit q = value + 16: 4 vectors of 32 bytes, vector t holding chunk t's low 4 bits in its low
//   nibbles and chunk t + 4's in its high nibbles, then 8 32-bit words, word i holding bit 4 of chunk i's bytes
//   (bit p for byte p). 176 bytes, the 8 rows' Q5_0 bytes.
//   Q4_1x8: the 4-bit q as Q5_0x8's 4 vectors (no high bits). 160 bytes, the 8 rows' Q4_1 bytes.
// So a repacked tensor has the plain tensor's shape [N, row_bytes].
//
// Arithmetic (every path, every CPU): out[n] = sum over blocks b, in order, of fma(d_w * d_x, float(dot_b), .)
// starting from 0, where dot_b is the exact integer dot of block b (Q4_1 then adds fma(m_w, s_x, .), its min term
// against the activation block's stored sum, as ggml's vec_dot uses it). The integer dot is exact in every variant
// (VNNI, AVX2, scalar), so a row's bits depend on nothing but its own weights and activation: batch-invariant,
// thread-invariant, and the same on a CPU without AVX-512 or AVX2. The float order differs from ggml's vec_dot
// (it sums eight lanes per block and adds them at the end), so values agree with it to float rounding.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/q8_kernels.h"

namespace specswap::quant {

constexpr int64_t kX8Rows = 8;
// Type ids of the interleaved layouts in the ggml_* operators (not ggml types: ggml's ids stay below 100).
constexpr int64_t kTypeQ4_1x8 = 1003;
constexpr int64_t kTypeQ5_0x8 = 1006;
constexpr int64_t kTypeQ8_0x8 = 1008;
constexpr int64_t kTypeQ4_Kx8 = 1012;
constexpr int64_t kTypeQ6_Kx8 = 1014;

enum class X8Kind { kQ8_0, kQ5_0, kQ4_1, kQ4_K, kQ6_K };
constexpr bool x8_is_k(X8Kind kind) { return kind == X8Kind::kQ4_K || kind == X8Kind::kQ6_K; }
// values of one block
constexpr int64_t x8_block_values(X8Kind kind) { return x8_is_k(kind) ? 256 : 32; }
// bytes of one block of 8 interleaved rows
constexpr size_t x8_block_bytes(X8Kind kind) {
  switch (kind) {
    case X8Kind::kQ8_0: return kX8Rows * sizeof(BlockQ8_0);
    case X8Kind::kQ5_0: return kX8Rows * sizeof(BlockQ5_0);
    case X8Kind::kQ4_1: return kX8Rows * sizeof(BlockQ4_1);
    case X8Kind::kQ4_K: return kX8Rows * sizeof(BlockQ4_K);
    case X8Kind::kQ6_K: return kX8Rows * sizeof(BlockQ6_K);
  }
  return 0;
}

// rows % 8 == 0; src: rows x blocks plain blocks (row-major, BlockQ8_0 / BlockQ5_0 / BlockQ4_1 / BlockQ4_K /
// BlockQ6_K), dst: the same bytes interleaved.
void repack_x8(X8Kind kind, const void* src, int64_t rows, int64_t blocks, uint8_t* dst);
// One row of an interleaved tensor back to its `blocks` plain blocks.
void unpack_x8_row(X8Kind kind, const uint8_t* packed, int64_t row, int64_t blocks, void* dst);

// The activation rows as the kernels read them, index r * blocks + b: the block's 32 values at qs + 32 index, its
// fp32 scale, the sum of its values (the unsigned storage's correction) and, for Q4_1, its stored sum s (fp32).
struct X8Activations {
  const int8_t* qs;
  const float* scales;
  const int32_t* sums;
  const float* mins;  // Q4_1 only
};
// From m rows of `blocks` Q8_0 blocks, or Q8_1 blocks (q8_1: Q4_1's activation type, which also fills mins).
void x8_act_prepare(bool q8_1, const void* act, int64_t blocks, int64_t m, int8_t* qs, float* scales, int32_t* sums,
                    float* mins);

enum class X8Path { kScalar, kAvx2, kVnni };
// kVnni needs AVX-512 F/BW/VL/VNNI; kAvx2 AVX2, FMA and F16C.
X8Path x8_best_path(bool allow_avx2, bool allow_vnni);

// out[r * out_stride + n - 8 g0] for groups [g0, g1) of 8 weight rows (n in [8 g0, 8 g1)), activation rows [0, m).
void x8_gemm(X8Kind kind, X8Path path, const uint8_t* packed, int64_t g0, int64_t g1, const X8Activations& act,
             int64_t blocks, int64_t m, float* out, int64_t out_stride);

// ---- K-quants (x8k_kernels.cpp) --------------------------------------------------------------------------------
// Q4_Kx8 / Q6_Kx8, per group of 8 weight rows and per super-block of 256 values (value v: 32-value group v / 32,
// chunk i = (v % 32) / 4 of it, byte 4p + v % 4 of the chunk for row p; a group's 4-bit parts as Q4_1x8's 4 vectors):
//   Q4_Kx8 (1152 bytes, the 8 rows' Q4_K bytes): 8 fp16 d, 8 fp16 dmin; 64 bytes whose low nibbles are the low 4
//   bits of the scales (entry 8j + p: sub-block j, row p) and high nibbles those of the mins (entry
//   16 (j / 2) + 2p + j % 2: int16 pairs of sub-blocks per row); 32 bytes of the scales' and mins' high 2 bits
//   (entry e's in nibble e / 32 of byte e % 32: bits 0..1 the scale's, 2..3 the min's); the 4-bit values.
//   Q6_Kx8 (1680 bytes, the 8 rows' Q6_K bytes): 8 fp16 d; 128 int8 scales (entry 8g + p: 16-value sub-block g);
//   the values' low 4 bits; per 32-value group two vectors of their high 2 bits (chunk i: vector i % 2, bits
//   2 (i / 2)).
// Arithmetic: per block the exact int32 isum = sum_j scale_j * dot_j (Q6_K: of value - 32) and, for Q4_K,
// imin = sum_j min_j * (sum of sub-block j's activation values, from Q8_K's bsums); then
// acc = fma(d_w * d_x, float(isum), acc) and, for Q4_K, acc = fma(-(dmin_w * d_x), float(imin), acc).
void repack_x8k(X8Kind kind, const void* src, int64_t rows, int64_t blocks, uint8_t* dst);
void unpack_x8k_row(X8Kind kind, const uint8_t* packed, int64_t row, int64_t blocks, void* dst);
// act: m rows of `blocks` Q8_K blocks, read in place
void x8k_gemm(X8Kind kind, X8Path path, const uint8_t* packed, int64_t g0, int64_t g1, const BlockQ8_K* act,
              int64_t blocks, int64_t m, float* out, int64_t out_stride);

}  // namespace specswap::quant
