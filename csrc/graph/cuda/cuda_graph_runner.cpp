// CUDA graphs: at::cuda::CUDAGraph per runner, captured on a side stream,
// every runner of every tier allocating from one graph_pool_handle().
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "graph/graph_runner.h"

namespace specswap::graph {
namespace {

class CudaGraphPool final : public GraphPool {
 public:
  explicit CudaGraphPool(c10::Device device)
      : GraphPool(device),
        handle_(at::cuda::graph_pool_handle()),
        capture_stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}
  at::cuda::MempoolId_t handle() const { return handle_; }
  c10::cuda::CUDAStream capture_stream() const { return capture_stream_; }

 private:
  at::cuda::MempoolId_t handle_;
  c10::cuda::CUDAStream capture_stream_;
};

std::size_t reserved_bytes(c10::DeviceIndex device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  return static_cast<std::size_t>(stats.reserved_bytes[0].current);
}

class CudaGraphRunner final : public GraphRunner {
 public:
  using GraphRunner::GraphRunner;
  const char* backend() const override { return "cuda"; }

 protected:
  void do_capture(const std::function<void()>& body) override {
    auto& pool = static_cast<CudaGraphPool&>(*this->pool());
    c10::cuda::CUDAGuard device_guard(pool.device());
    const auto device = pool.device().index();
    c10::cuda::device_synchronize();
    const std::size_t before = reserved_bytes(device);
    {
      c10::cuda::CUDAStreamGuard stream_guard(pool.capture_stream());
      body();  // warm-up outside capture: lazy library handles, workspace allocations
      pool.capture_stream().synchronize();
      graph_.capture_begin(pool.handle());
      body();
      graph_.capture_end();
    }
    c10::cuda::device_synchronize();
    captured_bytes_ = reserved_bytes(device) - std::min(before, reserved_bytes(device));
  }
  void do_replay() override { graph_.replay(); }
  std::size_t backend_bytes() const override { return captured_bytes_; }

 private:
  at::cuda::CUDAGraph graph_;
  std::size_t captured_bytes_ = 0;
};

}  // namespace

std::shared_ptr<GraphPool> make_cuda_pool(c10::Device device) { return std::make_shared<CudaGraphPool>(device); }

std::shared_ptr<GraphRunner> make_cuda_runner(Stage stage, int steps, int bucket, std::shared_ptr<GraphPool> pool) {
  if (!dynamic_cast<CudaGraphPool*>(pool.get())) throw std::invalid_argument("a CUDA runner needs a CUDA GraphPool");
  return std::make_shared<CudaGraphRunner>(stage, steps, bucket, std::move(pool));
}

}  // namespace specswap::graph
