// Batch-invariant attention for fp32 decoding: each query's output depends only on its own query and the keys
// its mask allows, computed in a fixed order. Verifying k + 1 tokens then gives, bit for bit, what decoding them
// one at a time gives (torch's SDPA blocks its reductions by the padded key length and the query count, so tiny
// differences appear, and per-block activation quantization can turn them into a different token).
//
//   invariant_attention(q [B, H, T, D], keys [B, KVH, L, D], values [B, KVH, L, D], mask [B, 1, T, L] bool,
//                       scale) -> [B, H, T, D]       (H a multiple of KVH: grouped-query attention)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

namespace specswap::quant {
namespace {

// q . k over D in a fixed order: 8 independent lanes, then the lanes summed in order
inline float dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  float total = 0.0f;
  for (; i < n; ++i) total += a[i] * b[i];
  for (int l = 0; l < 8; ++l) total += lanes[l];
  return total;
}

at::Tensor invariant_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                               const at::Tensor& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && keys.dim() == 4 && values.dim() == 4 && mask.dim() == 4,
              "invariant_attention: q, keys, values and mask must be 4-D, got ", q.sizes(), ", ", keys.sizes(), ", ",
              values.sizes(), ", ", mask.sizes());
  TORCH_CHECK(q.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat && values.scalar_type() == at::kFloat,
              "invariant_attention: q, keys and values must be float32, got ", q.scalar_type(), ", ",
              keys.scalar_type(), ", ", values.scalar_type());
  TORCH_CHECK(mask.scalar_type() == at::kBool, "invariant_attention: mask must be bool, got ", mask.scalar_type());
  const int64_t batch = q.size(0), heads = q.size(1), length = q.size(2), dim = q.size(3);
  const int64_t kv_heads = keys.size(1), key_length = keys.size(2);
  TORCH_CHECK(keys.size(0) == batch && values.sizes() == keys.sizes() && keys.size(3) == dim,
              "invariant_attention: keys/values ", keys.sizes(), " do not fit q ", q.sizes());
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "invariant_attention: ", heads, " query heads are not a multiple of ",
              kv_heads, " KV heads");
  TORCH_CHECK(mask.size(0) == batch && mask.size(1) == 1 && mask.size(2) == length && mask.size(3) == key_length,
              "invariant_attention: mask ", mask.sizes(), " must be [", batch, ", 1, ", length, ", ", key_length, "]");
  const at::Tensor qc = q.contiguous(), kc = keys.contiguous(), vc = values.contiguous(), mc = mask.contiguous();
  at::Tensor out = at::empty_like(qc);
  const float* qp = qc.data_ptr<float>();
  const float* kp = kc.data_ptr<float>();
  const float* vp = vc.data_ptr<float>();
  const bool* mp = mc.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  const int64_t group = heads / kv_heads;
  const float s = static_cast<float>(scale);
  at::parallel_for(0, batch * heads * length, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    if (scores.size() < static_cast<size_t>(key_length)) scores.resize(key_length);
    for (int64_t index = begin; index < end; ++index) {
      const int64_t t = index % length, h = (index / length) % heads, b = index / (length * heads);
      const float* query = qp + index * dim;
      const bool* allowed = mp + (b * length + t) * key_length;
      const int64_t kvh = h / group;
      const float* key0 = kp + (b * kv_heads + kvh) * key_length * dim;
      const float* value0 = vp + (b * kv_heads + kvh) * key_length * dim;
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < key_length; ++j) {
        if (!allowed[j]) continue;
        scores[j] = dot(query, key0 + j * dim, dim) * s;
        best = std::max(best, scores[j]);
      }
      float* result = op + index * dim;
      for (int64_t d = 0; d < dim; ++d) result[d] = 0.0f;
      if (best == -std::numeric_limits<float>::infinity()) continue;  // no key allowed: zeros
      float total = 0.0f;
      for (int64_t j = 0; j < key_length; ++j) {
        if (!allowed[j]) continue;
        const float weight = std::exp(scores[j] - best);
        total += weight;
        const float* value = value0 + j * dim;
        for (int64_t d = 0; d < dim; ++d) result[d] += weight * value[d];
      }
      const float inverse = 1.0f / total;
      for (int64_t d = 0; d < dim; ++d) result[d] *= inverse;
    }
  });
  return out;
}

}  // namespace
}  // namespace specswap::quant

TORCH_LIBRARY_FRAGMENT(specswap, m) {
  m.def("invariant_attention(Tensor q, Tensor keys, Tensor values, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(specswap, CPU, m) { m.impl("invariant_attention", &specswap::quant::invariant_attention); }
