#include "graph/graph_runner.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace specswap::graph {
namespace {
std::atomic<std::uint64_t> g_capture_count{0};

[[maybe_unused]] [[noreturn]] void not_built(const char* backend, const char* option) {
  throw std::runtime_error(std::string("specswap was built without ") + backend +
                           " graph runners; rebuild with -D" + option +
                           "=ON (see tools/build_wheel.sh) or run with disable_graphs=True");
}
}  // namespace

namespace detail {
void note_capture() noexcept { g_capture_count.fetch_add(1, std::memory_order_relaxed); }
}  // namespace detail

std::uint64_t capture_count() noexcept { return g_capture_count.load(std::memory_order_relaxed); }

const char* stage_name(Stage stage) {
  switch (stage) {
    case Stage::kDraft: return "draft";
    case Stage::kVerify: return "verify";
    case Stage::kDraftExtend: return "draft_extend";
    case Stage::kRound: return "round";
  }
  return "?";
}

Stage stage_from_name(const std::string& name) {
  if (name == "draft") return Stage::kDraft;
  if (name == "verify") return Stage::kVerify;
  if (name == "draft_extend") return Stage::kDraftExtend;
  if (name == "round") return Stage::kRound;
  throw std::invalid_argument("unknown stage '" + name + "'; valid: draft, verify, draft_extend, round");
}

GraphPool::GraphPool(c10::Device device) : device_(device) {}

at::Tensor GraphPool::derived(const void* key, const std::function<at::Tensor()>& make) {
  auto it = derived_.find(key);
  if (it == derived_.end()) it = derived_.emplace(key, make()).first;
  return it->second;
}

std::size_t GraphPool::derived_bytes() const {
  std::size_t bytes = 0;
  for (const auto& [key, tensor] : derived_) bytes += static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
  return bytes;
}

void GraphPool::share(const at::Tensor& tensor) {
  const void* storage = tensor.storage().unsafeGetStorageImpl();
  if (!is_shared(tensor)) shared_storages_.push_back(storage);
}

bool GraphPool::is_shared(const at::Tensor& tensor) const {
  if (!tensor.defined() || !tensor.has_storage()) return false;
  const void* storage = tensor.storage().unsafeGetStorageImpl();
  return std::find(shared_storages_.begin(), shared_storages_.end(), storage) != shared_storages_.end();
}

GraphRunner::GraphRunner(Stage stage, int speculative_num_steps, int bucket, std::shared_ptr<GraphPool> pool)
    : stage_(stage), steps_(speculative_num_steps), bucket_(bucket), pool_(std::move(pool)) {
  if (bucket < 1) throw std::invalid_argument("bucket must be >= 1, got " + std::to_string(bucket));
  if (speculative_num_steps < 0) {
    throw std::invalid_argument("speculative_num_steps must be >= 0, got " + std::to_string(speculative_num_steps));
  }
  if (!pool_) throw std::invalid_argument("GraphRunner needs a GraphPool");
}

void GraphRunner::capture(const std::function<void()>& body) {
  if (captured_) {
    throw std::logic_error(std::string(stage_name(stage_)) + " runner (steps=" + std::to_string(steps_) +
                           ", bucket=" + std::to_string(bucket_) + ") was already captured");
  }
  const auto start = std::chrono::steady_clock::now();
  do_capture(body);
  capture_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  captured_ = true;
  detail::note_capture();
}

void GraphRunner::replay() {
  if (!captured_) {
    throw std::logic_error(std::string("replay() before capture() on the ") + stage_name(stage_) + " runner");
  }
  do_replay();
}

void GraphRunner::set_buffer(const std::string& name, at::Tensor tensor) {
  if (captured_) throw std::logic_error("buffer '" + name + "' set after capture; buffers are fixed at capture");
  if (tensor.device() != pool_->device()) {
    throw std::invalid_argument("buffer '" + name + "' is on " + tensor.device().str() + " but the runner is on " +
                                pool_->device().str());
  }
  buffers_[name] = std::move(tensor);
}

const at::Tensor& GraphRunner::buffer(const std::string& name) const {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) {
    std::string known;
    for (const auto& [key, value] : buffers_) known += (known.empty() ? "" : ", ") + key;
    throw std::out_of_range("no buffer '" + name + "'; buffers: [" + known + "]");
  }
  return it->second;
}

std::vector<std::string> GraphRunner::buffer_names() const {
  std::vector<std::string> names;
  for (const auto& [key, value] : buffers_) names.push_back(key);
  return names;
}

std::size_t GraphRunner::memory_bytes() const {
  std::size_t bytes = backend_bytes();
  for (const auto& [name, tensor] : buffers_) {
    if (!pool_->is_shared(tensor)) bytes += tensor.nbytes();
  }
  return bytes;
}

std::shared_ptr<GraphPool> make_graph_pool(c10::Device device) {
  switch (device.type()) {
    case c10::DeviceType::CPU: return std::make_shared<GraphPool>(device);
    case c10::DeviceType::CUDA: return make_cuda_pool(device);
    case c10::DeviceType::PrivateUse1: return make_npu_pool(device);  // torch_npu registers as PrivateUse1
    default: {
      std::string built;
      for (const auto& name : compiled_backends()) built += (built.empty() ? "" : ", ") + name;
      throw std::invalid_argument("no graph runner for device " + device.str() + "; backends in this build: " + built);
    }
  }
}

std::shared_ptr<GraphRunner> make_graph_runner(Stage stage, int speculative_num_steps, int bucket,
                                               const std::shared_ptr<GraphPool>& pool) {
  switch (pool->device().type()) {
    case c10::DeviceType::CPU: return make_cpu_runner(stage, speculative_num_steps, bucket, pool);
    case c10::DeviceType::CUDA: return make_cuda_runner(stage, speculative_num_steps, bucket, pool);
    case c10::DeviceType::PrivateUse1: return make_npu_runner(stage, speculative_num_steps, bucket, pool);
    default: throw std::invalid_argument("no graph runner for device " + pool->device().str());
  }
}

std::vector<std::string> compiled_backends() {
  std::vector<std::string> out{"cpu"};
#ifdef SPECSWAP_WITH_CUDA
  out.push_back("cuda");
#endif
#ifdef SPECSWAP_WITH_NPU
  out.push_back("npu");
#endif
  return out;
}

#ifndef SPECSWAP_WITH_CUDA
std::shared_ptr<GraphPool> make_cuda_pool(c10::Device) { not_built("CUDA", "SPECSWAP_WITH_CUDA"); }
std::shared_ptr<GraphRunner> make_cuda_runner(Stage, int, int, std::shared_ptr<GraphPool>) {
  not_built("CUDA", "SPECSWAP_WITH_CUDA");
}
#endif
#ifndef SPECSWAP_WITH_NPU
std::shared_ptr<GraphPool> make_npu_pool(c10::Device) { not_built("Ascend NPU", "SPECSWAP_WITH_NPU"); }
std::shared_ptr<GraphRunner> make_npu_runner(Stage, int, int, std::shared_ptr<GraphPool>) {
  not_built("Ascend NPU", "SPECSWAP_WITH_NPU");
}
#endif

}  // namespace specswap::graph
