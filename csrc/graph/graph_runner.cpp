#include "graph/graph_runner.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace specswap::graph {
namespace {
std::atomic<std::uint64_t> g_capture_count{0};

// Function-local, so a registration from any translation unit's static
// initialisation finds it constructed.
std::map<c10::DeviceType, GraphBackend>& registry() {
  static std::map<c10::DeviceType, GraphBackend> backends;
  return backends;
}

// Backends a build may leave out, and the CMake option that builds each:
// asking for one that is not registered says how to get it.
struct OptionalBackend {
  c10::DeviceType type;
  const char* what;
  const char* option;
};
constexpr OptionalBackend kOptionalBackends[] = {
    {c10::DeviceType::CUDA, "CUDA", "SPECSWAP_WITH_CUDA"},
    {c10::DeviceType::PrivateUse1, "Ascend NPU", "SPECSWAP_WITH_NPU"},  // torch_npu registers as PrivateUse1
};

const GraphBackend& backend_for(c10::Device device) {
  const auto it = registry().find(device.type());
  if (it != registry().end()) return it->second;
  for (const auto& optional : kOptionalBackends) {
    if (optional.type == device.type()) {
      throw std::runtime_error(std::string("specswap was built without ") + optional.what +
                               " graph runners; rebuild with -D" + optional.option +
                               "=ON (see tools/build_wheel.sh) or run with disable_graphs=True");
    }
  }
  std::string built;
  for (const auto& name : compiled_backends()) built += (built.empty() ? "" : ", ") + name;
  throw std::invalid_argument("no graph runner for device " + device.str() + "; backends in this build: " + built);
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

void register_graph_backend(c10::DeviceType type, GraphBackend backend) {
  if (!registry().emplace(type, backend).second) {
    throw std::logic_error(std::string("a graph backend for ") + c10::DeviceTypeName(type) +
                           " is already registered (" + registry().at(type).name + ")");
  }
}

std::shared_ptr<GraphPool> make_graph_pool(c10::Device device) { return backend_for(device).make_pool(device); }

std::shared_ptr<GraphRunner> make_graph_runner(Stage stage, int speculative_num_steps, int bucket,
                                               const std::shared_ptr<GraphPool>& pool) {
  return backend_for(pool->device()).make_runner(stage, speculative_num_steps, bucket, pool);
}

std::vector<std::string> compiled_backends() {
  std::vector<std::string> out;
  for (const auto& [type, backend] : registry()) out.emplace_back(backend.name);
  return out;
}

}  // namespace specswap::graph
