// RMS norm in one operator: y = x / rms(x) * (offset + weight), the reduction in fp32 in a fixed order, so a
// row's bits do not depend on the rows beside it. One op where the module's Python spelled seven to ten (cast,
// square, mean, add, rsqrt, multiply, cast), which on a 270M model is most of a decode step's small operators.
//
//   rms_norm(x [..., H] fp32|bf16, weight [H] (x's dtype or fp32), eps, offset) -> [..., H] in x's dtype
//   offset 0 (Llama): weight * cast(x * inv_rms) (the product in x's dtype);
//   offset 1 (Gemma, which stores weight - 1): cast(x * inv_rms * (1 + weight)).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cmath>

namespace specswap::cpu_ops {
namespace {

template <typename T>
void norm_rows(const T* x, const T* w_same, const float* w_float, int64_t rows, int64_t h, float eps,
               float offset, T* y) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * h;
      T* yr = y + r * h;
      // sum of squares: 8 independent lanes, then the lanes in order
      float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= h; i += 8) {
        for (int l = 0; l < 8; ++l) {
          const float v = static_cast<float>(xr[i + l]);
          lanes[l] += v * v;
        }
      }
      float total = 0.0f;
      for (; i < h; ++i) total += static_cast<float>(xr[i]) * static_cast<float>(xr[i]);
      for (int l = 0; l < 8; ++l) total += lanes[l];
      const float inv = 1.0f / std::sqrt(total / static_cast<float>(h) + eps);
      if (offset == 0.0f) {
        for (int64_t j = 0; j < h; ++j) {
          const float normed = static_cast<float>(static_cast<T>(static_cast<float>(xr[j]) * inv));
          const float weight = w_same != nullptr ? static_cast<float>(w_same[j]) : w_float[j];
          yr[j] = static_cast<T>(weight * normed);
        }
      } else {
        for (int64_t j = 0; j < h; ++j) {
          const float weight = w_same != nullptr ? static_cast<float>(w_same[j]) : w_float[j];
          yr[j] = static_cast<T>(static_cast<float>(xr[j]) * inv * (offset + weight));
        }
      }
    }
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, double offset) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "rms_norm: x and weight must be on the CPU");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "rms_norm: x must be float32 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1), "rms_norm: weight ", weight.sizes(),
              " does not fit x ", x.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() || weight.scalar_type() == at::kFloat,
              "rms_norm: weight must be float32 or x's dtype, got ", weight.scalar_type());
  const at::Tensor input = x.contiguous(), w = weight.contiguous();
  at::Tensor out = at::empty_like(input);
  const int64_t h = input.size(-1), rows = h == 0 ? 0 : input.numel() / h;
  if (rows == 0) return out;
  const float e = static_cast<float>(eps), o = static_cast<float>(offset);
  const float* w_float = w.scalar_type() == at::kFloat ? w.data_ptr<float>() : nullptr;
  if (input.scalar_type() == at::kFloat) {
    norm_rows<float>(input.data_ptr<float>(), nullptr, w.data_ptr<float>(), rows, h, e, o,
                     out.data_ptr<float>());
  } else {
    const c10::BFloat16* w_same = w_float == nullptr ? w.data_ptr<c10::BFloat16>() : nullptr;
    norm_rows<c10::BFloat16>(input.data_ptr<c10::BFloat16>(), w_same, w_float, rows, h, e, o,
                             out.data_ptr<c10::BFloat16>());
  }
  return out;
}

}  // namespace
}  // namespace specswap::cpu_ops

TORCH_LIBRARY_FRAGMENT(specswap, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, float offset) -> Tensor");
}

TORCH_LIBRARY_IMPL(specswap, CPU, m) { m.impl("rms_norm", &specswap::cpu_ops::rms_norm); }
