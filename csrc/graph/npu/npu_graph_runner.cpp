// Ascend NPU graphs: c10_npu::NPUGraph per runner (ACL model-RI capture on a
// non-default stream), one graph pool handle shared by every runner of every
// tier, as on CUDA (see cuda_graph_runner.cpp for why sharing is safe). What
// changes between rounds (positions, cache rows, masks built from them) is
// read from the runner's persistent buffers, so a replay needs no argument
// updates. The runner takes the per-tier arguments (stage,
// speculative_num_steps, bucket) exactly as the CUDA one, and runs the same
// capture sequence (device_capture.h): device synchronised before the
// warm-up, a failed capture ended, the graph's bytes measured on the NPU
// caching allocator.
#include <torch_npu/csrc/core/npu/NPUCachingAllocator.h>
#include <torch_npu/csrc/core/npu/NPUFunctions.h>
#include <torch_npu/csrc/core/npu/NPUGraph.h>
#include <torch_npu/csrc/core/npu/NPUGraphsUtils.h>
#include <torch_npu/csrc/core/npu/NPUGuard.h>
#include <torch_npu/csrc/core/npu/NPUStream.h>

#include <stdexcept>
#include <string>

#include "graph/device_capture.h"
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

std::size_t npu_reserved_bytes(c10::DeviceIndex device) {
  const auto stats = c10_npu::NPUCachingAllocator::getDeviceStats(device);
  return static_cast<std::size_t>(
      stats.reserved_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current);
}

// The NPU side of the shared capture sequence (device_capture.h).
class NpuCaptureHooks final : public DeviceCaptureHooks {
 public:
  NpuCaptureHooks(c10_npu::NPUGraph& graph, const NpuGraphPool& pool)
      : graph_(graph), device_(pool.device().index()), stream_(pool.capture_stream()), pool_(pool.handle()) {}
  void synchronize_device() override { c10_npu::device_synchronize(); }
  void on_capture_stream(const std::function<void()>& fn) override {
    c10_npu::NPUStreamGuard stream_guard(stream_);
    fn();
  }
  void synchronize_capture_stream() override { stream_.synchronize(); }
  std::size_t reserved_bytes() override { return npu_reserved_bytes(device_); }
  void begin_capture() override { graph_.capture_begin(pool_); }
  void end_capture() override { graph_.capture_end(); }
  // Ends a capture that failed halfway, so the stream leaves capture mode and
  // the pool stops taking this device's allocations. While the stream is
  // still capturing (active or invalidated), NPUGraph::capture_end() ends the
  // ACL model-RI capture, drops the graph from torch_npu's currently-capturing
  // table and ends the allocator's routing to the pool (on an invalidated
  // capture it throws, after as much of that as its version does). Whatever
  // it left, endAllocateToPool ends the routing (it throws if that was
  // already done), and reset() discards a partial graph with its hold on the
  // pool and its entry in the currently-capturing table.
  void abort_capture() noexcept override {
    try {
      if (c10_npu::captureStatusMayInitCtx(stream_.stream(false)) != c10_npu::CaptureStatus::None) {
        graph_.capture_end();
      }
    } catch (...) {
      // the capture was invalidated, or its end failed: the steps below still apply
    }
    try {
      c10_npu::NPUCachingAllocator::endAllocateToPool(device_, pool_);
    } catch (...) {
      // already ended (or never begun): nothing to undo
    }
    try {
      graph_.reset();
    } catch (...) {
      // reset() reports its own failures as warnings; nothing more to do here
    }
  }

 private:
  c10_npu::NPUGraph& graph_;
  c10::DeviceIndex device_;
  c10_npu::NPUStream stream_;
  c10_npu::MempoolId_t pool_;
};

class NpuGraphRunner final : public GraphRunner {
 public:
  using GraphRunner::GraphRunner;
  const char* backend() const override { return "npu"; }

 protected:
  void do_capture(const std::function<void()>& body) override {
    auto& pool = static_cast<NpuGraphPool&>(*this->pool());
    c10_npu::NPUGuard device_guard(pool.device());
    NpuCaptureHooks hooks(graph_, pool);
    captured_bytes_ = run_device_capture(
        hooks, body,
        CaptureLabel{"NPU", stage_name(stage()), speculative_num_steps(), bucket(),
                     "a host sync inside a captured forward, e.g. .item(), .tolist() or a copy from host memory, "
                     "is not allowed"});
  }
  // Asynchronous on the caller's current stream, as on CUDA: work queued after
  // it on that stream sees its outputs. No host synchronization per replay.
  void do_replay() override { graph_.replay(); }
  std::size_t backend_bytes() const override { return captured_bytes_; }

 private:
  c10_npu::NPUGraph graph_;
  std::size_t captured_bytes_ = 0;
};

std::shared_ptr<GraphPool> make_pool(c10::Device device) { return std::make_shared<NpuGraphPool>(device); }

std::shared_ptr<GraphRunner> make_runner(Stage stage, int steps, int bucket, std::shared_ptr<GraphPool> pool) {
  if (!dynamic_cast<NpuGraphPool*>(pool.get())) throw std::invalid_argument("an NPU runner needs an NPU GraphPool");
  return std::make_shared<NpuGraphRunner>(stage, steps, bucket, std::move(pool));
}

}  // namespace

SPECSWAP_REGISTER_GRAPH_BACKEND(c10::DeviceType::PrivateUse1, GraphBackend{"npu", &make_pool, &make_runner});

}  // namespace specswap::graph
