// Several reader threads acquire the active state while a writer switches
// tiers SPECSWAP_STRESS_SWITCHES times (default 1,000,000). A torn read is a
// state whose step count, draft-token count and stage resources disagree.
// Built with -DSPECSWAP_SANITIZER=thread this also runs under ThreadSanitizer.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "check.h"
#include "core/state_pool.h"

using namespace specswap;

namespace {

struct TaggedResource final : StageResource {
  TaggedResource(int steps, int stage) : steps(steps), stage(stage) {}
  const int steps;
  const int stage;
};

std::shared_ptr<RuntimeState> make_state(int steps) {
  return std::make_shared<RuntimeState>(
      steps, steps + 1, std::make_shared<TaggedResource>(steps, 0),
      std::make_shared<TaggedResource>(steps, 1),
      std::make_shared<TaggedResource>(steps, 2));
}

bool consistent(const RuntimeState& state) {
  const int k = state.speculative_num_steps;
  auto tag = [&](const std::shared_ptr<const StageResource>& r, int stage) {
    auto* t = static_cast<const TaggedResource*>(r.get());
    return t->steps == k && t->stage == stage;
  };
  return state.speculative_num_draft_tokens == k + 1 && tag(state.draft, 0) &&
         tag(state.verify, 1) && tag(state.draft_extend, 2);
}

}  // namespace

int main() {
  long switches = 1000000;
  if (const char* env = std::getenv("SPECSWAP_STRESS_SWITCHES")) switches = std::atol(env);
  const int tiers[] = {1, 3, 7};

  StatePool pool;
  for (int k : tiers) pool.register_state(make_state(k));
  pool.activate(1);

  std::atomic<bool> stop{false};
  std::atomic<long> torn{0}, reads{0}, shared_reads{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      long local_reads = 0, local_torn = 0, local_shared = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (r == 0) {
          // A holder that keeps the state alive by shared ownership.
          auto held = pool.acquire_shared();
          local_torn += !consistent(*held);
          ++local_shared;
        } else {
          const RuntimeState* state = pool.acquire();
          local_torn += !consistent(*state);
        }
        ++local_reads;
      }
      torn += local_torn;
      reads += local_reads;
      shared_reads += local_shared;
    });
  }

  // A tier registered while readers run.
  pool.register_state(make_state(5));
  const int order[] = {1, 3, 7, 5};
  for (long i = 0; i < switches; ++i) pool.activate(order[(i + 1) % 4]);
  stop = true;
  for (auto& t : readers) t.join();

  std::printf("switches=%ld reads=%ld shared_reads=%ld torn=%ld pool_switches=%llu\n",
              switches, reads.load(), shared_reads.load(), torn.load(),
              static_cast<unsigned long long>(pool.num_switches()));
  CHECK(torn.load() == 0);
  CHECK(reads.load() > 0);
  CHECK(pool.num_switches() == static_cast<unsigned long long>(switches));
  double total = 0;
  for (const auto& s : pool.stats()) total += s.seconds_active;
  CHECK(total > 0);
  CHECK(throws([&] { pool.activate(2); }));
  CHECK(throws([&] { pool.register_state(make_state(3)); }));
  return 0;
}
