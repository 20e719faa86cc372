// The policy from C++ alone (a serving loop without Python).
#include <vector>

#include "check.h"
#include "core/adaptive_params.h"

using namespace specswap;

int main() {
  AdaptiveConfig fast;
  fast.ema_alpha = 1.0;
  fast.warmup_batches = 0;
  fast.update_interval = 1;

  AdaptiveSpeculativeParams params(3, fast);
  CHECK(params.current_steps() == 3 && params.ema() == 2.0);
  const std::vector<int> high{3, 3}, low{0}, mid{2, 3};
  CHECK(params.update(high) && params.current_steps() == 7);
  CHECK(params.update(low) && params.current_steps() == 1);
  CHECK(!params.update(std::vector<int>{}) && params.num_batches() == 2);
  CHECK(params.update(mid) && params.current_steps() == 3);  // 2.5: up to 3, not 7

  AdaptiveConfig snap;
  snap.snap_initial_steps = true;
  AdaptiveSpeculativeParams snapped(2, snap);
  CHECK(snapped.current_steps() == 3 && snapped.ema() == 2.0);
  AdaptiveSpeculativeParams added(2, AdaptiveConfig{});
  CHECK(added.candidate_steps().size() == 4 && added.current_steps() == 2);

  AdaptiveConfig bad;
  bad.ema_alpha = 0.0;
  CHECK(throws([&] { bad.validate(); }));
  bad = AdaptiveConfig{};
  bad.candidate_steps = {3};
  CHECK(throws([&] { bad.validate(); }));
  bad = AdaptiveConfig{};
  bad.update_interval = 0;
  CHECK(throws([&] { bad.validate(); }));
  return 0;
}
