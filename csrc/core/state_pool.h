// State pool: one prebuilt runtime state per speculative tier and an atomic
// pointer to the active one. Readers (the decode loop) take no lock; a switch
// is one atomic store between decode rounds.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/tier_key.h"

namespace specswap {

// Resources of one stage (draft, verify or draft-extend) of one tier: graph
// runners, attention metadata, buffers. C++ runners derive from it; the Python
// binding wraps arbitrary Python objects in it.
class StageResource {
 public:
  virtual ~StageResource() = default;
};

// Everything one decode round needs for one tier: its three stages and the
// round that runs them (the driver over the stages, and the whole round
// captured as one graph where the backend records it). Immutable once built:
// a reader holding it can never see one tier's step count paired with another
// tier's draft-token count or runners.
class RuntimeState : public std::enable_shared_from_this<RuntimeState> {
 public:
  RuntimeState(int speculative_num_steps, int speculative_num_draft_tokens,
               std::shared_ptr<const StageResource> draft,
               std::shared_ptr<const StageResource> verify,
               std::shared_ptr<const StageResource> draft_extend,
               std::shared_ptr<const StageResource> round = nullptr,
               int speculative_eagle_topk = 1);

  const int speculative_num_steps;
  const int speculative_num_draft_tokens;
  const int speculative_eagle_topk;  // 1: a chain
  // The pool's key for this tier (core/tier_key.h): a chain's step count, or a tree's encoded shape.
  int key() const noexcept {
    return tier_key({speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens});
  }
  const std::shared_ptr<const StageResource> draft;
  const std::shared_ptr<const StageResource> verify;
  const std::shared_ptr<const StageResource> draft_extend;
  const std::shared_ptr<const StageResource> round;
};

struct TierStats {
  int tier;  // the tier's key (a chain: its step count)
  bool active;
  std::uint64_t activations;  // times this tier became the active one
  double seconds_active;      // wall time spent as the active tier
};

class StatePool {
 public:
  using Clock = std::chrono::steady_clock;

  StatePool() = default;
  StatePool(const StatePool&) = delete;
  StatePool& operator=(const StatePool&) = delete;

  // Adds a prebuilt state. A tier is registered once; a second state for the
  // same key is an error (a reader may still hold the first).
  void register_state(std::shared_ptr<const RuntimeState> state);

  // The active state in one atomic load, or nullptr before the first
  // activate(). The pointer stays valid for the pool's lifetime: states are
  // never removed.
  const RuntimeState* acquire() const noexcept {
    return active_.load(std::memory_order_acquire);
  }

  // Shared ownership of the active state, for holders that may outlive the
  // pool. One atomic load plus a reference-count increment.
  std::shared_ptr<const RuntimeState> acquire_shared() const;

  // Tiers are known by their key (RuntimeState::key(): a chain's step count).
  // Publishes the prebuilt state of the tier keyed `tier_key` with one atomic
  // store. Returns true if the active tier changed. Throws
  // std::invalid_argument for a tier that was never registered.
  bool activate(int tier_key);

  bool contains(int tier_key) const;
  std::vector<int> tiers() const;
  int active_tier() const noexcept;  // the active tier's key; -1 before the first activate()
  std::uint64_t num_switches() const;
  std::vector<TierStats> stats() const;
  std::size_t size() const;

 private:
  struct Tier {
    std::shared_ptr<const RuntimeState> state;
    std::uint64_t activations = 0;
    Clock::duration time_active{};
  };

  // Serialises writers (register, activate) and the statistics they keep.
  // Readers never take it.
  mutable std::mutex mutex_;
  std::map<int, Tier> tiers_;
  Tier* active_tier_ = nullptr;
  Clock::time_point active_since_{};
  std::uint64_t num_switches_ = 0;
  std::atomic<const RuntimeState*> active_{nullptr};
};

std::string format_tiers(const std::vector<int>& tiers);

}  // namespace specswap
