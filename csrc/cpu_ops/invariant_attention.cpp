// Batch-invariant attention for fp32 decoding: each query's output depends only on its own query and the keys
// its mask allows, computed in a fixed order. Verifying k + 1 tokens then gives, bit for bit, what decoding them
// one at a time gives (torch's SDPA blocks its reductions by the padded key length and the query count, so tiny
// differences appear, and per-block activation quantization can turn them into a different token).
//
//   invariant_attention(q [B, H, T, D], key_buffer [S, KVH, C, D], value_buffer [S, KVH, C, D], slots [B] int64,
//                       mask [B, 1, T, L] bool, scale) -> [B, H, T, D]
//
// Row b reads the first L positions of cache slot slots[b] in place (no gathered copy of the keys and values);
// H is a multiple of KVH (grouped-query attention). Per query, in this order: the scores of the allowed keys
// (q . k over D: 8 lanes of products summed in order, then the lanes summed in order, times the scale), their
// maximum, the weights exp(score - max) (simd_math.h's exp, whose two forms give the same bits) summed in key order, the values summed in key order with those weights,
// times 1 / sum. The AVX2 form does the same float operations (separate multiplies and adds, never fused), only
// several keys' lanes or several output lanes at once, so every CPU gives the same bits.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include "cpu_ops/simd_math.h"

#include <cmath>
#include <limits>
#include <vector>

namespace specswap::cpu_ops {
namespace {

#define SPECSWAP_ATTN_AVX2 __attribute__((target("avx2")))

// the dot's lanes summed in order, after the tail (n % 8 values, in order, from 0)
inline float finish_dot(const float* lanes, const float* a, const float* b, int64_t from, int64_t n) {
  float total = 0.0f;
  for (int64_t i = from; i < n; ++i) total += a[i] * b[i];
  for (int l = 0; l < 8; ++l) total += lanes[l];
  return total;
}

// ---- scalar: the reference --------------------------------------------------------------------------------------

inline float dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  return finish_dot(lanes, a, b, i, n);
}

void scores_scalar(const float* query, const float* key0, int64_t key_stride, const int32_t* keys, int64_t count,
                   int64_t dim, float scale, float* scores) {
  for (int64_t i = 0; i < count; ++i) scores[i] = dot(query, key0 + keys[i] * key_stride, dim) * scale;
}

void weighted_sum_scalar(const float* value0, int64_t value_stride, const int32_t* keys, const float* weights,
                         int64_t count, int64_t dim, float* result) {
  for (int64_t d = 0; d < dim; ++d) result[d] = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    const float* value = value0 + keys[i] * value_stride;
    for (int64_t d = 0; d < dim; ++d) result[d] += weights[i] * value[d];
  }
}

// ---- AVX2: four keys' dots at once; eight output lanes' chains at once ------------------------------------------

// scores[i, i + kKeys): kKeys keys' 8-lane dots side by side, one query load for all of them
template <int kKeys>
SPECSWAP_ATTN_AVX2 inline void score_keys(const float* query, const float* key0, int64_t key_stride,
                                          const int32_t* keys, int64_t dim, float scale, float* scores) {
  const int64_t full = dim / 8 * 8;
  const float* k[kKeys];
  __m256 acc[kKeys];
  for (int t = 0; t < kKeys; ++t) k[t] = key0 + keys[t] * key_stride, acc[t] = _mm256_setzero_ps();
  for (int64_t d = 0; d < full; d += 8) {
    const __m256 q = _mm256_loadu_ps(query + d);
    for (int t = 0; t < kKeys; ++t) acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(q, _mm256_loadu_ps(k[t] + d)));
  }
  alignas(32) float lanes[8];
  for (int t = 0; t < kKeys; ++t) {
    _mm256_store_ps(lanes, acc[t]);
    scores[t] = finish_dot(lanes, query, k[t], full, dim) * scale;
  }
}

SPECSWAP_ATTN_AVX2 void scores_avx2(const float* query, const float* key0, int64_t key_stride, const int32_t* keys,
                                    int64_t count, int64_t dim, float scale, float* scores) {
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) score_keys<4>(query, key0, key_stride, keys + i, dim, scale, scores + i);
  for (; i < count; ++i) score_keys<1>(query, key0, key_stride, keys + i, dim, scale, scores + i);
}

// result[d, d + 8 kChains): kChains output lanes of 8 floats, each an add chain over the keys in order
template <int kChains>
SPECSWAP_ATTN_AVX2 inline void sum_lanes(const float* value0, int64_t value_stride, const int32_t* keys,
                                         const float* weights, int64_t count, int64_t d, float* result) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < count; ++i) {
    const float* value = value0 + keys[i] * value_stride + d;
    const __m256 w = _mm256_set1_ps(weights[i]);
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(w, _mm256_loadu_ps(value + 8 * c)));
  }
  for (int c = 0; c < kChains; ++c) _mm256_storeu_ps(result + d + 8 * c, acc[c]);
}

SPECSWAP_ATTN_AVX2 void weighted_sum_avx2(const float* value0, int64_t value_stride, const int32_t* keys,
                                          const float* weights, int64_t count, int64_t dim, float* result) {
  int64_t d = 0;
  for (; d + 64 <= dim; d += 64) sum_lanes<8>(value0, value_stride, keys, weights, count, d, result);
  for (; d + 8 <= dim; d += 8) sum_lanes<1>(value0, value_stride, keys, weights, count, d, result);
  for (; d < dim; ++d) {
    float acc = 0.0f;
    for (int64_t i = 0; i < count; ++i) acc += weights[i] * value0[keys[i] * value_stride + d];
    result[d] = acc;
  }
}

// scores[i] = exp(scores[i] - best), eight at a time
SPECSWAP_ATTN_AVX2 void exp_shifted_avx2(float* scores, int64_t count, float best) {
  const __m256 shift = _mm256_set1_ps(best);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(scores + i, simd_math::exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + i), shift)));
  }
  for (; i < count; ++i) scores[i] = simd_math::exp(scores[i] - best);
}

at::Tensor invariant_attention(const at::Tensor& q, const at::Tensor& key_buffer, const at::Tensor& value_buffer,
                               const at::Tensor& slots, const at::Tensor& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && key_buffer.dim() == 4 && value_buffer.dim() == 4 && mask.dim() == 4,
              "invariant_attention: q, key_buffer, value_buffer and mask must be 4-D, got ", q.sizes(), ", ",
              key_buffer.sizes(), ", ", value_buffer.sizes(), ", ", mask.sizes());
  TORCH_CHECK(q.scalar_type() == at::kFloat && key_buffer.scalar_type() == at::kFloat &&
                  value_buffer.scalar_type() == at::kFloat,
              "invariant_attention: q, key_buffer and value_buffer must be float32, got ", q.scalar_type(), ", ",
              key_buffer.scalar_type(), ", ", value_buffer.scalar_type());
  TORCH_CHECK(mask.scalar_type() == at::kBool, "invariant_attention: mask must be bool, got ", mask.scalar_type());
  TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == at::kLong,
              "invariant_attention: slots must be 1-D int64, got ", slots.sizes(), " ", slots.scalar_type());
  const int64_t batch = q.size(0), heads = q.size(1), length = q.size(2), dim = q.size(3);
  const int64_t kv_heads = key_buffer.size(1), capacity = key_buffer.size(2), key_length = mask.size(3);
  TORCH_CHECK(value_buffer.sizes() == key_buffer.sizes() && key_buffer.size(3) == dim,
              "invariant_attention: key_buffer/value_buffer ", key_buffer.sizes(), ", ", value_buffer.sizes(),
              " do not fit q ", q.sizes());
  TORCH_CHECK(key_buffer.stride(3) == 1 && value_buffer.stride(3) == 1,
              "invariant_attention: key_buffer and value_buffer need a contiguous last dimension");
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "invariant_attention: ", heads,
              " query heads are not a multiple of ", kv_heads, " KV heads");
  TORCH_CHECK(slots.size(0) == batch, "invariant_attention: ", slots.size(0), " slots for a batch of ", batch);
  TORCH_CHECK(mask.size(0) == batch && mask.size(1) == 1 && mask.size(2) == length && key_length <= capacity,
              "invariant_attention: mask ", mask.sizes(), " must be [", batch, ", 1, ", length,
              ", L] with L at most the cache capacity ", capacity);
  TORCH_CHECK(key_length <= std::numeric_limits<int32_t>::max(), "invariant_attention: ", key_length, " keys");
  const at::Tensor qc = q.contiguous(), mc = mask.contiguous(), sc = slots.contiguous();
  const int64_t* slot = sc.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(slot[b] >= 0 && slot[b] < key_buffer.size(0), "invariant_attention: slot ", slot[b],
                " is outside the cache's ", key_buffer.size(0), " slots");
  }
  at::Tensor out = at::empty_like(qc);
  const float* qp = qc.data_ptr<float>();
  const float* kp = key_buffer.data_ptr<float>();
  const float* vp = value_buffer.data_ptr<float>();
  const bool* mp = mc.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  const int64_t group = heads / kv_heads;
  const float s = static_cast<float>(scale);
  const bool simd = simd_math::simd_enabled();
  at::parallel_for(0, batch * heads * length, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    thread_local std::vector<int32_t> allowed;
    if (scores.size() < static_cast<size_t>(key_length)) scores.resize(key_length);
    if (allowed.size() < static_cast<size_t>(key_length)) allowed.resize(key_length);
    for (int64_t index = begin; index < end; ++index) {
      const int64_t t = index % length, h = (index / length) % heads, b = index / (length * heads);
      const float* query = qp + index * dim;
      const bool* row = mp + (b * length + t) * key_length;
      const int64_t kvh = h / group;
      const float* key0 = kp + slot[b] * key_buffer.stride(0) + kvh * key_buffer.stride(1);
      const float* value0 = vp + slot[b] * value_buffer.stride(0) + kvh * value_buffer.stride(1);
      int64_t count = 0;
      for (int64_t j = 0; j < key_length; ++j) {
        if (row[j]) allowed[count++] = static_cast<int32_t>(j);
      }
      float* result = op + index * dim;
      if (count == 0) {  // no key allowed: zeros
        for (int64_t d = 0; d < dim; ++d) result[d] = 0.0f;
        continue;
      }
      if (simd) {
        scores_avx2(query, key0, key_buffer.stride(2), allowed.data(), count, dim, s, scores.data());
      } else {
        scores_scalar(query, key0, key_buffer.stride(2), allowed.data(), count, dim, s, scores.data());
      }
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < count; ++i) best = std::max(best, scores[i]);
      if (simd) {
        exp_shifted_avx2(scores.data(), count, best);
      } else {
        for (int64_t i = 0; i < count; ++i) scores[i] = simd_math::exp(scores[i] - best);
      }
      float total = 0.0f;
      for (int64_t i = 0; i < count; ++i) total += scores[i];
      if (simd) {
        weighted_sum_avx2(value0, value_buffer.stride(2), allowed.data(), scores.data(), count, dim, result);
      } else {
        weighted_sum_scalar(value0, value_buffer.stride(2), allowed.data(), scores.data(), count, dim, result);
      }
      const float inverse = 1.0f / total;
      for (int64_t d = 0; d < dim; ++d) result[d] *= inverse;
    }
  });
  return out;
}

}  // namespace

}  // namespace specswap::cpu_ops

TORCH_LIBRARY_FRAGMENT(specswap, m) {
  m.def("invariant_attention(Tensor q, Tensor key_buffer, Tensor value_buffer, Tensor slots, Tensor mask, float scale) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(specswap, CPU, m) { m.impl("invariant_attention", &specswap::cpu_ops::invariant_attention); }
