// Ascend NPU graphs: c10_npu::NPUGraph per runner (ACL model-RI capture on a
// non-default stream), one graph pool handle shared by every runner of every
// tier, as on CUDA (see cuda_graph_runner.cpp for why sharing is safe). What
// changes between rounds (positions, cache rows, masks built from them) is
// read from the runner's persistent buffers, so a replay needs no argument
// updates. The runner takes the per-tier arguments (stage,
// speculative_num_steps, bucket) exactly as the CUDA one.
#include <torch_npu/csrc/core/npu/NPUFunctions.h>
#include <torch_npu/csrc/core/npu/NPUGraph.h>
#include <torch_npu/csrc/core/npu/NPUGuard.h>
#include <torch_npu/csrc/core/npu/NPUStream.h>

#include <stdexcept>
#include <string>

#include "graph/graph_runner.h"

namespace specswap::graph {
namespace {

// As on CUDA: an index-less device means the current one, and the pool holds it explicitly.
c10::Device with_index(c10::Device device) {
  const auto count = c10_npu::device_count();
  if (count <= 0) {
    throw std::runtime_error("an NPU graph pool needs a visible Ascend device; none was found "
                             "(run with disable_graphs=True, or on a machine with CANN and an NPU)");
  }
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10_npu::current_device();
  if (index < 0 || index >= count) {
    throw std::invalid_argument("NPU device " + device.str() + " does not exist; valid: npu:0..npu:" +
                                std::to_string(count - 1));
  }
  return c10::Device(device.type(), index);
}

class NpuGraphPool final : public GraphPool {
 public:
  explicit NpuGraphPool(c10::Device device)
      : GraphPool(with_index(device)),
        handle_(c10_npu::graph_pool_handle()),
        capture_stream_(c10_npu::getNPUStreamFromPool(this->device().index())) {}
  c10_npu::MempoolId_t handle() const { return handle_; }
  c10_npu::NPUStream capture_stream() const { return capture_stream_; }

 private:
  c10_npu::MempoolId_t handle_;
  c10_npu::NPUStream capture_stream_;
};

class NpuGraphRunner final : public GraphRunner {
 public:
  using GraphRunner::GraphRunner;
  const char* backend() const override { return "npu"; }

 protected:
  void do_capture(const std::function<void()>& body) override {
    auto& pool = static_cast<NpuGraphPool&>(*this->pool());
    c10_npu::NPUGuard device_guard(pool.device());
    auto stream = pool.capture_stream();
    // the caller's stream wrote the buffers; the capture stream must see that work
    c10_npu::getCurrentNPUStream().synchronize();
    {
      c10_npu::NPUStreamGuard stream_guard(stream);
      body();  // warm-up outside capture
      stream.synchronize();
      graph_.capture_begin(pool.handle());
      try {
        body();
      } catch (const std::exception& error) {
        throw std::runtime_error(std::string("NPU graph capture of the ") + stage_name(stage()) + " runner (steps=" +
                                 std::to_string(speculative_num_steps()) + ", bucket=" + std::to_string(bucket()) +
                                 ") failed: " + error.what());
      }
      graph_.capture_end();
    }
    stream.synchronize();
  }
  // Asynchronous on the caller's current stream, as on CUDA: work queued after
  // it on that stream sees its outputs. No host synchronization per replay.
  void do_replay() override { graph_.replay(); }

 private:
  c10_npu::NPUGraph graph_;
};

std::shared_ptr<GraphPool> make_pool(c10::Device device) { return std::make_shared<NpuGraphPool>(device); }

std::shared_ptr<GraphRunner> make_runner(Stage stage, int steps, int bucket, std::shared_ptr<GraphPool> pool) {
  if (!dynamic_cast<NpuGraphPool*>(pool.get())) throw std::invalid_argument("an NPU runner needs an NPU GraphPool");
  return std::make_shared<NpuGraphRunner>(stage, steps, bucket, std::move(pool));
}

}  // namespace

SPECSWAP_REGISTER_GRAPH_BACKEND(c10::DeviceType::PrivateUse1, GraphBackend{"npu", &make_pool, &make_runner});

}  // namespace specswap::graph
