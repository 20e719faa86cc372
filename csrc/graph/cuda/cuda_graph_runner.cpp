// CUDA graphs: at::cuda::CUDAGraph per runner, captured on a side stream,
// every runner of every tier allocating from one graph_pool_handle().
//
// Sharing one private pool between all runners is safe here although torch
// only promises it for graphs replayed in capture order: nothing allocated
// during a capture outlives it (a runner's inputs and outputs are persistent
// buffers made before capture, weights and caches are shared), so the pool
// only ever holds a graph's intermediates, which each replay writes before it
// reads them, and all replays run one after another on the caller's stream.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "graph/device_capture.h"
#include "graph/graph_runner.h"

namespace specswap::graph {
namespace {

// torch.device("cuda") has no index while the tensors it makes live on
// cuda:<current>; the pool compares buffer devices by index, so it holds the
// explicit one (and reads allocator statistics of that device).
c10::Device with_index(c10::Device device) {
  const auto count = c10::cuda::device_count();
  if (count <= 0) {
    throw std::runtime_error("a CUDA graph pool needs a visible CUDA device; none was found "
                             "(run with disable_graphs=True, or on a machine with a GPU)");
  }
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  if (index < 0 || index >= count) {
    throw std::invalid_argument("CUDA device " + device.str() + " does not exist; valid: cuda:0.." +
                                "cuda:" + std::to_string(count - 1));
  }
  return c10::Device(c10::DeviceType::CUDA, index);
}

class CudaGraphPool final : public GraphPool {
 public:
  explicit CudaGraphPool(c10::Device device)
      : GraphPool(with_index(device)),
        handle_(at::cuda::graph_pool_handle()),
        capture_stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, this->device().index())) {}
  at::cuda::MempoolId_t handle() const { return handle_; }
  c10::cuda::CUDAStream capture_stream() const { return capture_stream_; }

 private:
  at::cuda::MempoolId_t handle_;
  c10::cuda::CUDAStream capture_stream_;
};

std::size_t cuda_reserved_bytes(c10::DeviceIndex device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  return static_cast<std::size_t>(
      stats.reserved_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current);
}

// The CUDA side of the shared capture sequence (device_capture.h).
class CudaCaptureHooks final : public DeviceCaptureHooks {
 public:
  CudaCaptureHooks(at::cuda::CUDAGraph& graph, const CudaGraphPool& pool)
      : graph_(graph), device_(pool.device().index()), stream_(pool.capture_stream()), pool_(pool.handle()) {}
  void synchronize_device() override { c10::cuda::device_synchronize(); }
  void on_capture_stream(const std::function<void()>& fn) override {
    c10::cuda::CUDAStreamGuard stream_guard(stream_);
    fn();
  }
  void synchronize_capture_stream() override { stream_.synchronize(); }
  std::size_t reserved_bytes() override { return cuda_reserved_bytes(device_); }
  // Global: any unsafe CUDA call from another thread during capture fails it, rather than corrupting it
  void begin_capture() override { graph_.capture_begin(pool_, cudaStreamCaptureModeGlobal); }
  void end_capture() override { graph_.capture_end(); }
  // Ends a capture that failed halfway, so the stream can be used again (its partial graph is discarded).
  void abort_capture() noexcept override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(stream_.stream(), &partial) == cudaSuccess && partial != nullptr) {
        cudaGraphDestroy(partial);
      }
    }
    (void)cudaGetLastError();  // the capture's error is reported by the exception, not left for the next call
    try {
      // capture_end() never completed: stop routing this capture's allocations to the shared pool
      c10::cuda::CUDACachingAllocator::endAllocateToPool(device_, pool_);
    } catch (...) {
      // already ended (or never begun): nothing to undo
    }
  }

 private:
  at::cuda::CUDAGraph& graph_;
  c10::DeviceIndex device_;
  c10::cuda::CUDAStream stream_;
  at::cuda::MempoolId_t pool_;
};

class CudaGraphRunner final : public GraphRunner {
 public:
  using GraphRunner::GraphRunner;
  const char* backend() const override { return "cuda"; }

 protected:
  void do_capture(const std::function<void()>& body) override {
    auto& pool = static_cast<CudaGraphPool&>(*this->pool());
    c10::cuda::CUDAGuard device_guard(pool.device());
    CudaCaptureHooks hooks(graph_, pool);
    captured_bytes_ = run_device_capture(
        hooks, body,
        CaptureLabel{"CUDA", stage_name(stage()), speculative_num_steps(), bucket(),
                     "a host sync inside a captured forward, e.g. .item(), .tolist() or a copy from host memory, "
                     "is not allowed"});
  }
  // Asynchronous on the caller's current stream, like any kernel launch: the
  // outputs are ready for work queued after it on that stream.
  void do_replay() override { graph_.replay(); }
  std::size_t backend_bytes() const override { return captured_bytes_; }

 private:
  at::cuda::CUDAGraph graph_;
  std::size_t captured_bytes_ = 0;
};

std::shared_ptr<GraphPool> make_pool(c10::Device device) { return std::make_shared<CudaGraphPool>(device); }

std::shared_ptr<GraphRunner> make_runner(Stage stage, int steps, int bucket, std::shared_ptr<GraphPool> pool) {
  if (!dynamic_cast<CudaGraphPool*>(pool.get())) throw std::invalid_argument("a CUDA runner needs a CUDA GraphPool");
  return std::make_shared<CudaGraphRunner>(stage, steps, bucket, std::move(pool));
}

}  // namespace

SPECSWAP_REGISTER_GRAPH_BACKEND(c10::DeviceType::CUDA, GraphBackend{"cuda", &make_pool, &make_runner});

}  // namespace specswap::graph
