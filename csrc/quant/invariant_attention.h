// torch.ops.specswap.invariant_attention (invariant_attention.cpp): its AVX2 form (same bits as the scalar one).
#pragma once

namespace specswap::quant {

// The AVX2 form on (the default where the CPU has AVX2) or off (the scalar form); returns the previous setting.
bool invariant_attention_set_simd(bool enabled);

}  // namespace specswap::quant
