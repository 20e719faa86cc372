// One captured stage (draft, verify or draft-extend) of one tier at one batch
// bucket. Persistent input/output buffers are owned by the runner; a caller
// copies inputs in, calls replay(), and reads the outputs. Capture happens
// once, at start-up; capture_count() proves that nothing is captured later.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace specswap::graph {

// kRound: a whole greedy decode round (drafts, verify, acceptance, draft-extend) in one runner
enum class Stage : int { kDraft = 0, kVerify = 1, kDraftExtend = 2, kRound = 3 };
const char* stage_name(Stage stage);
Stage stage_from_name(const std::string& name);

// Every capture in the process, across backends.
std::uint64_t capture_count() noexcept;

// Memory shared by all runners of all tiers of one model (the backend's graph
// memory pool, where it has one; on the CPU it only carries the device).
class GraphPool {
 public:
  explicit GraphPool(c10::Device device);
  virtual ~GraphPool() = default;
  c10::Device device() const { return device_; }

  // Storages that exist once for the whole model (weights, KV caches): a
  // runner that reads them does not count their bytes as its own.
  void share(const at::Tensor& tensor);
  bool is_shared(const at::Tensor& tensor) const;

  // CPU, bf16: record each matmul by a weight as oneDNN's linear over the
  // weight repacked once (faster at the small batches decoding runs, same
  // bits; checked at capture). Off unless the caller turns it on: the packed
  // copy is a second copy of the weights, worth it for small models only.
  bool pack_linear_weights() const noexcept { return pack_linear_weights_; }
  void set_pack_linear_weights(bool on) noexcept { pack_linear_weights_ = on; }
  // A tensor derived once from a shared one (a repacked weight), keyed by the
  // source's data pointer and shared by every runner of the pool.
  at::Tensor derived(const void* key, const std::function<at::Tensor()>& make);
  std::size_t derived_bytes() const;

 private:
  c10::Device device_;
  std::vector<const void*> shared_storages_;
  bool pack_linear_weights_ = false;
  std::map<const void*, at::Tensor> derived_;
};

class GraphRunner {
 public:
  GraphRunner(Stage stage, int speculative_num_steps, int bucket, std::shared_ptr<GraphPool> pool);
  virtual ~GraphRunner() = default;

  // Runs `body` once and records what it does. The body must read only the
  // persistent buffers (or shared tensors) and write its results into the
  // persistent output buffers. May be called once.
  void capture(const std::function<void()>& body);
  // Re-runs what was captured. Throws if nothing was captured. On a device
  // it is queued on the caller's current stream and returns without waiting.
  void replay();

  virtual const char* backend() const = 0;
  bool captured() const noexcept { return captured_; }

  Stage stage() const noexcept { return stage_; }
  int speculative_num_steps() const noexcept { return steps_; }
  int bucket() const noexcept { return bucket_; }
  const std::shared_ptr<GraphPool>& pool() const noexcept { return pool_; }

  // Persistent buffers, by name. Set before capture; never replaced after.
  void set_buffer(const std::string& name, at::Tensor tensor);
  const at::Tensor& buffer(const std::string& name) const;
  std::vector<std::string> buffer_names() const;

  // Bytes this runner holds beyond the shared weights and caches: its
  // buffers plus whatever the backend keeps for the captured work.
  std::size_t memory_bytes() const;
  double capture_seconds() const noexcept { return capture_seconds_; }

 protected:
  virtual void do_capture(const std::function<void()>& body) = 0;
  virtual void do_replay() = 0;
  virtual std::size_t backend_bytes() const { return 0; }

 private:
  Stage stage_;
  int steps_;
  int bucket_;
  std::shared_ptr<GraphPool> pool_;
  std::map<std::string, at::Tensor> buffers_;
  bool captured_ = false;
  double capture_seconds_ = 0.0;
};

// The runner family comes from the pool's device: each backend's source
// registers itself (SPECSWAP_REGISTER_GRAPH_BACKEND) and these look it up.
std::shared_ptr<GraphPool> make_graph_pool(c10::Device device);
std::shared_ptr<GraphRunner> make_graph_runner(Stage stage, int speculative_num_steps, int bucket,
                                               const std::shared_ptr<GraphPool>& pool);
// Backends compiled into this build, e.g. {"cpu", "cuda"} (in device-type order).
std::vector<std::string> compiled_backends();

// What a backend registers for its device type.
struct GraphBackend {
  const char* name;  // "cpu", "cuda", "npu"
  std::shared_ptr<GraphPool> (*make_pool)(c10::Device device);
  std::shared_ptr<GraphRunner> (*make_runner)(Stage stage, int speculative_num_steps, int bucket,
                                             std::shared_ptr<GraphPool> pool);
};
// Throws std::logic_error if the device type already has a backend.
void register_graph_backend(c10::DeviceType type, GraphBackend backend);
struct GraphBackendRegistration {
  GraphBackendRegistration(c10::DeviceType type, GraphBackend backend) { register_graph_backend(type, backend); }
};
// At namespace scope in the backend's source, which is linked straight into
// the extension (not through a static library, whose unreferenced objects the
// linker would drop with their registrations).
#define SPECSWAP_REGISTER_GRAPH_BACKEND(device_type, ...) \
  static const ::specswap::graph::GraphBackendRegistration specswap_graph_backend_registration{device_type, __VA_ARGS__}

namespace detail {
void note_capture() noexcept;
}

}  // namespace specswap::graph
