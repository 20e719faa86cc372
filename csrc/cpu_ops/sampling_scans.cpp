// Sampling's passes over vocabulary rows, fp32 on the CPU.
//
// The two scans a keyed draw makes (specswap.sampling.sample_keyed), one pass each, and the first over rows:
//
//   first_argmax(x [V] fp32) -> int: the index of the largest value, the first one on ties, the first NaN
//                if there is one (what x.max(-1).indices gives);
//   argmax_rows(x [..., V] fp32) -> [...] int64: first_argmax of every row (what x.max(-1).indices gives,
//                in one pass a row: every greedy verify and step pays it);
//   indices_at_least(x [V] fp32, threshold) -> [n] int64: the ascending indices with x >= threshold, the
//                threshold rounded to fp32 first (what torch.nonzero(x >= threshold).squeeze(-1) gives).
//
// Both are exact (comparisons only), so the AVX2 and scalar forms give the same result. A sampled token pays
// both over the whole vocabulary; here each is one pass over the row.
//
// The full-law acceptance of a drafted chain, straight from the target's logits
// (specswap.sampling.accept_from_logits, the same decisions and draws):
//
//   accept_chain(logits [B, k+1, V], temperature [B], draft_tokens [B, k], draft_probs [B, k, V],
//                uniforms [B, k], residual_uniforms [B]) -> (accept_lengths [B], next_tokens [B]):
//                draft j is accepted while u_j q_j(d_j) < p_j(d_j), p_j = softmax(logits_j / T); where the
//                chain stops, the next token is drawn from normalised max(0, p - q) (p itself after the last
//                draft, or where no mass is left) by inverting its running sum at the residual uniform. A
//                row with T <= 0 is greedy: p is one-hot at the first largest logit.
//
// torch makes eleven passes for that (a log-sum-exp over every position, the stop row's law, its residual, a
// where, a running sum, two searches); here a position's normaliser is a max and an exp pass, computed only where the chain gets to, and the draw
// one exp pass and a search by blocks. exp is simd_math's, its values below exp(-87.3) taken as 0 (as the
// float they round towards), so both forms give the same bits; the running sum is in double.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "cpu_ops/simd_math.h"

namespace specswap::cpu_ops {
namespace {

const float* row_of(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.device().is_cpu(), op, ": x must be on the CPU, got ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat, op, ": x must be float32, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 1, op, ": x must be one row [V], got ", x.dim(), " dimensions");
  TORCH_CHECK(x.is_contiguous(), op, ": x must be contiguous");
  TORCH_CHECK(x.numel() > 0, op, ": x is empty");
  return x.const_data_ptr<float>();
}

// ---- scalar: the reference --------------------------------------------------------------------------------------

std::int64_t first_argmax_scalar(const float* x, std::int64_t n) {
  float best = x[0];
  std::int64_t index = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > best) best = x[i], index = i;
  }
  return index;
}

void at_least_scalar(const float* x, std::int64_t begin, std::int64_t n, float threshold,
                     std::vector<std::int64_t>& out) {
  for (std::int64_t i = begin; i < n; ++i) {
    if (x[i] >= threshold) out.push_back(i);
  }
}

// ---- AVX2 -------------------------------------------------------------------------------------------------------

__attribute__((target("avx2"))) std::int64_t first_argmax_avx2(const float* x, std::int64_t n) {
  // pass 1: the largest value (and whether any NaN is there); pass 2: its first index
  const std::int64_t whole = n - n % 8;
  __m256 best = _mm256_set1_ps(-INFINITY);
  __m256 unordered = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < whole; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    best = _mm256_max_ps(best, v);
  }
  if (_mm256_movemask_ps(unordered) != 0) return first_argmax_scalar(x, n);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, best);
  float value = lanes[0];
  for (float lane : lanes) value = lane > value ? lane : value;
  for (std::int64_t i = whole; i < n; ++i) {
    if (std::isnan(x[i])) return first_argmax_scalar(x, n);
    value = x[i] > value ? x[i] : value;
  }
  const __m256 target = _mm256_set1_ps(value);
  for (std::int64_t i = 0; i < whole; i += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), target, _CMP_EQ_OQ));
    if (mask != 0) return i + __builtin_ctz(static_cast<unsigned>(mask));
  }
  for (std::int64_t i = whole; i < n; ++i) {
    if (x[i] == value) return i;
  }
  return 0;  // every value -inf: the first
}

__attribute__((target("avx2"))) void at_least_avx2(const float* x, std::int64_t n, float threshold,
                                                   std::vector<std::int64_t>& out) {
  const std::int64_t whole = n - n % 8;
  const __m256 bar = _mm256_set1_ps(threshold);
  for (std::int64_t i = 0; i < whole; i += 8) {
    unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), bar, _CMP_GE_OQ)));
    while (mask != 0) {
      out.push_back(i + __builtin_ctz(mask));
      mask &= mask - 1;
    }
  }
  at_least_scalar(x, whole, n, threshold, out);
}

// first_argmax in the form simd_math chooses
std::int64_t first_argmax_of(const float* x, std::int64_t n) {
  return simd_math::simd_enabled() ? first_argmax_avx2(x, n) : first_argmax_scalar(x, n);
}

// ---- the chain's acceptance -------------------------------------------------------------------------------------

constexpr std::int64_t kBlock = 256;  // entries per block of the running sum (searched block by block)

// exp(x) as simd_math computes it, 0 below its range (where it would return exp(-87.3) instead)
inline float exp_or_zero(float x) { return x < simd_math::kExpLo ? 0.0f : simd_math::exp(x); }

__attribute__((target("avx2"))) inline __m256 exp8_or_zero(__m256 x) {
  const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(simd_math::kExpLo), _CMP_LT_OQ);
  return _mm256_andnot_ps(below, simd_math::exp8(x));
}

// Blocks of kBlock entries summed the same way in both forms: eight lanes of float over the block (entry i in
// lane i % 8, the block's last partial lanes too), the lanes then added in double in lane order.
double lanes_total(const float lanes[8]) {
  double total = 0.0;
  for (int lane = 0; lane < 8; ++lane) total += lanes[lane];
  return total;
}

// log sum_i exp(x_i / t - m) + m, m = max_i x_i / t (torch.logsumexp's steps; the sum by blocks in double)
float log_normaliser_scalar(const float* x, std::int64_t n, float t) {
  float top = -INFINITY;
  for (std::int64_t i = 0; i < n; ++i) top = std::fmax(top, x[i]);
  const float m = std::isfinite(top) ? top / t : 0.0f;
  double total = 0.0;
  for (std::int64_t begin = 0; begin < n; begin += kBlock) {
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const std::int64_t end = std::min(n, begin + kBlock);
    for (std::int64_t i = begin; i < end; ++i) lanes[(i - begin) % 8] += exp_or_zero(x[i] / t - m);
    total += lanes_total(lanes);
  }
  return static_cast<float>(std::log(total)) + m;
}

__attribute__((target("avx2"))) float log_normaliser_avx2(const float* x, std::int64_t n, float t) {
  const std::int64_t whole = n - n % 8;
  __m256 best = _mm256_set1_ps(-INFINITY);
  for (std::int64_t i = 0; i < whole; i += 8) best = _mm256_max_ps(best, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, best);
  float top = -INFINITY;
  for (float lane : lanes) top = std::fmax(top, lane);
  for (std::int64_t i = whole; i < n; ++i) top = std::fmax(top, x[i]);
  const float m = std::isfinite(top) ? top / t : 0.0f;
  const __m256 shift = _mm256_set1_ps(m), scale = _mm256_set1_ps(t);
  double total = 0.0;
  for (std::int64_t begin = 0; begin < n; begin += kBlock) {
    const std::int64_t end = std::min(n, begin + kBlock);
    const std::int64_t vector_end = begin + (end - begin) / 8 * 8;
    __m256 sum = _mm256_setzero_ps();
    for (std::int64_t i = begin; i < vector_end; i += 8) {
      sum = _mm256_add_ps(sum, exp8_or_zero(_mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), scale), shift)));
    }
    _mm256_store_ps(lanes, sum);
    for (std::int64_t i = vector_end; i < end; ++i) lanes[(i - begin) % 8] += exp_or_zero(x[i] / t - m);
    total += lanes_total(lanes);
  }
  return static_cast<float>(std::log(total)) + m;
}

// out_i = exp(x_i / t - lse), minus q_i and clamped at 0 where q is given; per block, the block's sum (as
// log_normaliser sums). Returns the total.
// Entries [from, end) of a block starting at `begin`: out_i, added to its lane.
void residual_entries(const float* x, const float* q, std::int64_t begin, std::int64_t from, std::int64_t end,
                      float t, float lse, float* out, float lanes[8]) {
  for (std::int64_t i = from; i < end; ++i) {
    const float p = exp_or_zero(x[i] / t - lse);
    out[i] = q == nullptr ? p : std::fmax(p - q[i], 0.0f);
    lanes[(i - begin) % 8] += out[i];
  }
}

double residual_scalar(const float* x, const float* q, std::int64_t n, float t, float lse, float* out,
                       double* block_sums) {
  double total = 0.0;
  for (std::int64_t begin = 0, block = 0; begin < n; begin += kBlock, ++block) {
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    residual_entries(x, q, begin, begin, std::min(n, begin + kBlock), t, lse, out, lanes);
    block_sums[block] = lanes_total(lanes);
    total += block_sums[block];
  }
  return total;
}

__attribute__((target("avx2"))) double residual_avx2(const float* x, const float* q, std::int64_t n, float t,
                                                     float lse, float* out, double* block_sums) {
  const __m256 shift = _mm256_set1_ps(lse), scale = _mm256_set1_ps(t), zero = _mm256_setzero_ps();
  alignas(32) float lanes[8];
  double total = 0.0;
  for (std::int64_t begin = 0, block = 0; begin < n; begin += kBlock, ++block) {
    const std::int64_t end = std::min(n, begin + kBlock);
    const std::int64_t vector_end = begin + (end - begin) / 8 * 8;
    __m256 sum = zero;
    for (std::int64_t i = begin; i < vector_end; i += 8) {
      __m256 p = exp8_or_zero(_mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), scale), shift));
      if (q != nullptr) p = _mm256_max_ps(_mm256_sub_ps(p, _mm256_loadu_ps(q + i)), zero);
      _mm256_storeu_ps(out + i, p);
      sum = _mm256_add_ps(sum, p);
    }
    _mm256_store_ps(lanes, sum);
    residual_entries(x, q, begin, vector_end, end, t, lse, out, lanes);
    block_sums[block] = lanes_total(lanes);
    total += block_sums[block];
  }
  return total;
}

// The entry where the running sum of w (non-negative, total > 0) first exceeds u * total: the block by the
// blocks' sums, then entry by entry in double; an entry of weight 0 is never drawn. Past the end (rounding):
// the last entry with weight.
std::int64_t invert_running_sum(const float* w, std::int64_t n, const double* block_sums, double total, float u) {
  const double target = static_cast<double>(u) * total;
  double before = 0.0;
  std::int64_t begin = 0;
  for (std::int64_t block = 0; begin + kBlock < n && before + block_sums[block] <= target; ++block) {
    before += block_sums[block];
    begin += kBlock;
  }
  for (std::int64_t i = begin; i < n; ++i) {
    before += w[i];
    if (w[i] > 0.0f && before > target) return i;
  }
  for (std::int64_t i = n - 1; i > 0; --i) {
    if (w[i] > 0.0f) return i;
  }
  return 0;
}

std::tuple<at::Tensor, at::Tensor> accept_chain(const at::Tensor& logits, const at::Tensor& temperature,
                                               const at::Tensor& draft_tokens, const at::Tensor& draft_probs,
                                               const at::Tensor& uniforms, const at::Tensor& residual_uniforms) {
  const char* op = "accept_chain";
  auto check = [op](const at::Tensor& t, const char* name, at::ScalarType type, int dims) {
    TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be on the CPU, got ", t.device());
    TORCH_CHECK(t.scalar_type() == type, op, ": ", name, " must be ", type, ", got ", t.scalar_type());
    TORCH_CHECK(t.dim() == dims, op, ": ", name, " must have ", dims, " dimensions, got ", t.dim());
    TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  };
  check(logits, "logits", at::kFloat, 3);
  check(temperature, "temperature", at::kFloat, 1);
  check(draft_tokens, "draft_tokens", at::kLong, 2);
  check(draft_probs, "draft_probs", at::kFloat, 3);
  check(uniforms, "uniforms", at::kFloat, 2);
  check(residual_uniforms, "residual_uniforms", at::kFloat, 1);
  const std::int64_t batch = logits.size(0), steps = logits.size(1) - 1, vocab = logits.size(2);
  TORCH_CHECK(steps >= 0 && vocab > 0, op, ": logits must be [B, k+1, V] with V > 0, got ", logits.sizes());
  TORCH_CHECK(temperature.size(0) == batch && residual_uniforms.size(0) == batch, op,
              ": temperature and residual_uniforms must be [B] = [", batch, "], got ", temperature.sizes(), " and ",
              residual_uniforms.sizes());
  TORCH_CHECK(draft_tokens.sizes() == at::IntArrayRef({batch, steps}) && uniforms.sizes() == draft_tokens.sizes(),
              op, ": draft_tokens and uniforms must be [B, k] = [", batch, ", ", steps, "], got ",
              draft_tokens.sizes(), " and ", uniforms.sizes());
  TORCH_CHECK(draft_probs.sizes() == at::IntArrayRef({batch, steps, vocab}), op, ": draft_probs must be [B, k, V] = [",
              batch, ", ", steps, ", ", vocab, "], got ", draft_probs.sizes());
  const float* x = logits.const_data_ptr<float>();
  const float* temps = temperature.const_data_ptr<float>();
  const std::int64_t* drafts = draft_tokens.const_data_ptr<std::int64_t>();
  const float* q = draft_probs.const_data_ptr<float>();
  const float* u = uniforms.const_data_ptr<float>();
  const float* u_residual = residual_uniforms.const_data_ptr<float>();
  for (std::int64_t i = 0; i < batch * steps; ++i) {
    TORCH_CHECK(0 <= drafts[i] && drafts[i] < vocab, op, ": draft token ", drafts[i], " is outside the vocabulary [0, ",
                vocab, ")");
  }
  const bool simd = simd_math::simd_enabled();
  // reused: the hot path allocates only its outputs
  thread_local std::vector<float> weights;
  thread_local std::vector<double> block_sums;
  weights.resize(static_cast<std::size_t>(vocab));
  block_sums.resize(static_cast<std::size_t>((vocab + kBlock - 1) / kBlock));
  at::Tensor accept_lengths = at::empty({batch}, draft_tokens.options());
  at::Tensor next_tokens = at::empty({batch}, draft_tokens.options());
  std::int64_t* lengths_out = accept_lengths.data_ptr<std::int64_t>();
  std::int64_t* next_out = next_tokens.data_ptr<std::int64_t>();
  for (std::int64_t b = 0; b < batch; ++b) {
    const float* row = x + b * (steps + 1) * vocab;  // position j: row + j * vocab
    const float t = temps[b];
    std::int64_t accepted = 0;
    if (!(t > 0.0f)) {  // greedy: p one-hot at the first largest logit, so the draw is that entry
      std::int64_t top = first_argmax_of(row, vocab);
      while (accepted < steps && drafts[b * steps + accepted] == top) {
        ++accepted;
        top = first_argmax_of(row + accepted * vocab, vocab);
      }
      lengths_out[b] = accepted, next_out[b] = top;
      continue;
    }
    float lse = 0.0f;
    for (; accepted <= steps; ++accepted) {
      const float* position = row + accepted * vocab;
      lse = simd ? log_normaliser_avx2(position, vocab, t) : log_normaliser_scalar(position, vocab, t);
      if (accepted == steps) break;
      const std::int64_t d = drafts[b * steps + accepted];
      const float p = exp_or_zero(position[d] / t - lse);
      if (!(u[b * steps + accepted] * q[(b * steps + accepted) * vocab + d] < p)) break;
    }
    const float* position = row + accepted * vocab;
    const float* q_at = accepted < steps ? q + (b * steps + accepted) * vocab : nullptr;
    auto residual = [&](const float* minus) {
      return simd ? residual_avx2(position, minus, vocab, t, lse, weights.data(), block_sums.data())
                  : residual_scalar(position, minus, vocab, t, lse, weights.data(), block_sums.data());
    };
    double total = residual(q_at);
    if (!(total > 0.0) && q_at != nullptr) total = residual(nullptr);  // p == q: no residual mass, p is the law
    lengths_out[b] = accepted;
    next_out[b] = invert_running_sum(weights.data(), vocab, block_sums.data(), total, u_residual[b]);
  }
  return {accept_lengths, next_tokens};
}

// ---- the operators ----------------------------------------------------------------------------------------------

std::int64_t first_argmax(const at::Tensor& x) {
  const float* data = row_of(x, "first_argmax");
  return first_argmax_of(data, x.numel());
}

at::Tensor argmax_rows(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu(), "argmax_rows: x must be on the CPU, got ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat, "argmax_rows: x must be float32, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "argmax_rows: x must have a non-empty last dimension, got ", x.sizes());
  TORCH_CHECK(x.is_contiguous(), "argmax_rows: x must be contiguous");
  const std::int64_t n = x.size(-1), rows = x.numel() / n;
  at::Tensor out = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(at::kLong));
  const float* data = x.const_data_ptr<float>();
  std::int64_t* index = out.data_ptr<std::int64_t>();
  for (std::int64_t row = 0; row < rows; ++row) index[row] = first_argmax_of(data + row * n, n);
  return out;
}

at::Tensor indices_at_least(const at::Tensor& x, double threshold) {
  const float* data = row_of(x, "indices_at_least");
  // reused: the hot path allocates only its output
  thread_local std::vector<std::int64_t> found;
  found.clear();
  const float bar = static_cast<float>(threshold);
  if (simd_math::simd_enabled()) {
    at_least_avx2(data, x.numel(), bar, found);
  } else {
    at_least_scalar(data, 0, x.numel(), bar, found);
  }
  at::Tensor out = at::empty({static_cast<std::int64_t>(found.size())}, x.options().dtype(at::kLong));
  std::copy(found.begin(), found.end(), out.data_ptr<std::int64_t>());
  return out;
}

}  // namespace
}  // namespace specswap::cpu_ops

TORCH_LIBRARY_FRAGMENT(specswap, m) {
  m.def("first_argmax(Tensor x) -> int");
  m.def("argmax_rows(Tensor x) -> Tensor");
  m.def("indices_at_least(Tensor x, float threshold) -> Tensor");
  m.def("accept_chain(Tensor logits, Tensor temperature, Tensor draft_tokens, Tensor draft_probs, Tensor uniforms, "
        "Tensor residual_uniforms) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(specswap, CPU, m) {
  m.impl("first_argmax", &specswap::cpu_ops::first_argmax);
  m.impl("argmax_rows", &specswap::cpu_ops::argmax_rows);
  m.impl("indices_at_least", &specswap::cpu_ops::indices_at_least);
  m.impl("accept_chain", &specswap::cpu_ops::accept_chain);
}
