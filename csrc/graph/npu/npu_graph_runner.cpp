// Ascend NPU graphs: c10_npu::NPUGraph per runner (ACL model-RI capture on a
// non-default stream), one graph pool handle shared by every runner of every
// tier. Launches whose arguments change every round (attention sequence
// lengths) are captured inside task groups and updated before replay on a
// separate stream, instead of re-capturing. The runner takes the per-tier
// arguments (stage, speculative_num_steps, bucket) exactly as the CUDA one.
#include <torch_npu/csrc/core/npu/NPUGraph.h>
#include <torch_npu/csrc/core/npu/NPUGuard.h>
#include <torch_npu/csrc/core/npu/NPUStream.h>

#include <stdexcept>
#include <vector>

#include "graph/graph_runner.h"

namespace specswap::graph {
namespace {

class NpuGraphPool final : public GraphPool {
 public:
  explicit NpuGraphPool(c10::Device device)
      : GraphPool(device),
        handle_(c10_npu::graph_pool_handle()),
        capture_stream_(c10_npu::getNPUStreamFromPool(device.index())),
        update_stream_(c10_npu::getNPUStreamFromPool(device.index())) {}
  c10_npu::MempoolId_t handle() const { return handle_; }
  c10_npu::NPUStream capture_stream() const { return capture_stream_; }
  c10_npu::NPUStream update_stream() const { return update_stream_; }

 private:
  c10_npu::MempoolId_t handle_;
  c10_npu::NPUStream capture_stream_;
  c10_npu::NPUStream update_stream_;
};

class NpuGraphRunner final : public GraphRunner {
 public:
  using GraphRunner::GraphRunner;
  const char* backend() const override { return "npu"; }

  void begin_task_group() override {
    if (!capturing_) throw std::logic_error("begin_task_group() outside capture()");
    c10_npu::graph_task_group_begin(npu_pool().capture_stream());
  }

  int end_task_group() override {
    if (!capturing_) throw std::logic_error("end_task_group() outside capture()");
    task_groups_.push_back(c10_npu::graph_task_group_end(npu_pool().capture_stream()));
    return static_cast<int>(task_groups_.size()) - 1;
  }

  void update_task_group(int group, const std::function<void()>& body) override {
    if (group < 0 || group >= static_cast<int>(task_groups_.size())) {
      throw std::out_of_range("task group " + std::to_string(group) + " does not exist; this runner has " +
                              std::to_string(task_groups_.size()));
    }
    auto stream = npu_pool().update_stream();
    c10_npu::NPUStreamGuard stream_guard(stream);
    c10_npu::graph_task_update_begin(stream, task_groups_[group]);
    body();  // re-issue the grouped launches with this round's arguments
    c10_npu::graph_task_update_end(stream);
  }

 protected:
  void do_capture(const std::function<void()>& body) override {
    auto& pool = npu_pool();
    c10_npu::NPUGuard device_guard(pool.device());
    {
      c10_npu::NPUStreamGuard stream_guard(pool.capture_stream());
      body();  // warm-up outside capture
      pool.capture_stream().synchronize();
      capturing_ = true;
      graph_.capture_begin(pool.handle());
      try {
        body();
      } catch (...) {
        capturing_ = false;
        throw;
      }
      graph_.capture_end();
      capturing_ = false;
    }
  }
  void do_replay() override {
    // updates were issued on the update stream; replay must see them
    npu_pool().update_stream().synchronize();
    graph_.replay();
  }

 private:
  NpuGraphPool& npu_pool() { return static_cast<NpuGraphPool&>(*pool()); }

  c10_npu::NPUGraph graph_;
  std::vector<c10_npu::NPUTaskGroupHandle> task_groups_;
  bool capturing_ = false;
};

}  // namespace

std::shared_ptr<GraphPool> make_npu_pool(c10::Device device) { return std::make_shared<NpuGraphPool>(device); }

std::shared_ptr<GraphRunner> make_npu_runner(Stage stage, int steps, int bucket, std::shared_ptr<GraphPool> pool) {
  if (!dynamic_cast<NpuGraphPool*>(pool.get())) throw std::invalid_argument("an NPU runner needs an NPU GraphPool");
  return std::make_shared<NpuGraphRunner>(stage, steps, bucket, std::move(pool));
}

}  // namespace specswap::graph
