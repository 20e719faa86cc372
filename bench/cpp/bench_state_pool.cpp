// Cost of the hot operations: acquire (one atomic load), acquire_shared,
// activate (one atomic store plus bookkeeping) and a policy update.
// Build: cmake -S . -B build/bench -DSPECSWAP_BUILD_PYTHON=OFF -DSPECSWAP_BUILD_BENCHMARKS=ON
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "core/adaptive_params.h"
#include "core/state_pool.h"

using namespace specswap;

namespace {

StatePool& shared_pool() {
  static StatePool* pool = [] {
    auto* p = new StatePool();
    for (int k : {1, 3, 7}) {
      p->register_state(std::make_shared<RuntimeState>(k, k + 1, nullptr, nullptr, nullptr));
    }
    p->activate(3);
    return p;
  }();
  return *pool;
}

void BM_Acquire(benchmark::State& state) {
  StatePool& pool = shared_pool();
  for (auto _ : state) {
    const RuntimeState* s = pool.acquire();
    benchmark::DoNotOptimize(s->speculative_num_steps);
  }
}
BENCHMARK(BM_Acquire)->ThreadRange(1, 2);

void BM_AcquireShared(benchmark::State& state) {
  StatePool& pool = shared_pool();
  for (auto _ : state) {
    auto s = pool.acquire_shared();
    benchmark::DoNotOptimize(s.get());
  }
}
BENCHMARK(BM_AcquireShared)->ThreadRange(1, 2);

void BM_Activate(benchmark::State& state) {
  StatePool pool;
  for (int k : {1, 3}) {
    pool.register_state(std::make_shared<RuntimeState>(k, k + 1, nullptr, nullptr, nullptr));
  }
  int i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(pool.activate((i++ & 1) ? 1 : 3));
  }
}
BENCHMARK(BM_Activate);

void BM_PolicyUpdate(benchmark::State& state) {
  AdaptiveConfig config;
  config.warmup_batches = 0;
  config.update_interval = 1;
  AdaptiveSpeculativeParams params(3, config);
  std::vector<int> batch(static_cast<std::size_t>(state.range(0)), 2);
  for (auto _ : state) {
    benchmark::DoNotOptimize(params.update(batch));
  }
}
BENCHMARK(BM_PolicyUpdate)->Arg(1)->Arg(8)->Arg(64);

}  // namespace
