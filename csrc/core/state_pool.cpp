#include "core/state_pool.h"

#include <sstream>
#include <stdexcept>

namespace specswap {

RuntimeState::RuntimeState(int speculative_num_steps,
                           int speculative_num_draft_tokens,
                           std::shared_ptr<const StageResource> draft,
                           std::shared_ptr<const StageResource> verify,
                           std::shared_ptr<const StageResource> draft_extend,
                           std::shared_ptr<const StageResource> round,
                           int speculative_eagle_topk)
    : speculative_num_steps(speculative_num_steps),
      speculative_num_draft_tokens(speculative_num_draft_tokens),
      speculative_eagle_topk(speculative_eagle_topk),
      draft(std::move(draft)),
      verify(std::move(verify)),
      draft_extend(std::move(draft_extend)),
      round(std::move(round)) {
  if (speculative_num_steps < 0) {
    throw std::invalid_argument("speculative_num_steps must be >= 0, got " +
                                std::to_string(speculative_num_steps));
  }
  if (speculative_eagle_topk > 1) {
    const std::string error = tree_shape_error(
        {speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens}, speculative_num_steps);
    if (!error.empty()) throw std::invalid_argument(error);
  } else if (speculative_eagle_topk < 1) {
    throw std::invalid_argument("speculative_eagle_topk must be >= 1, got " + std::to_string(speculative_eagle_topk));
  }
  if (speculative_num_draft_tokens < 1) {
    throw std::invalid_argument(
        "speculative_num_draft_tokens must be >= 1, got " +
        std::to_string(speculative_num_draft_tokens));
  }
}

std::string format_tiers(const std::vector<int>& tiers) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < tiers.size(); ++i) {
    out << (i ? ", " : "") << tiers[i];
  }
  out << "]";
  return out.str();
}

void StatePool::register_state(std::shared_ptr<const RuntimeState> state) {
  if (!state) {
    throw std::invalid_argument("register_state: state is null");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const int key = state->key();
  auto [it, inserted] = tiers_.try_emplace(key);
  if (!inserted) {
    throw std::invalid_argument("a state for tier " + std::to_string(key) +
                                " (speculative_num_steps=" + std::to_string(state->speculative_num_steps) +
                                ") is already registered");
  }
  it->second.state = std::move(state);
}

std::shared_ptr<const RuntimeState> StatePool::acquire_shared() const {
  const RuntimeState* state = acquire();
  // The pool owns every registered state, so the object is alive here and
  // shared_from_this() only bumps its reference count.
  return state ? state->shared_from_this() : nullptr;
}

bool StatePool::activate(int tier_key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = tiers_.find(tier_key);
  if (it == tiers_.end()) {
    std::vector<int> known;
    for (const auto& [key, tier] : tiers_) known.push_back(key);
    throw std::invalid_argument(
        "no state registered for tier " +
        std::to_string(tier_key) + "; registered tiers: " +
        format_tiers(known));
  }
  Tier* next = &it->second;
  if (next == active_tier_) return false;
  const auto now = Clock::now();
  if (active_tier_ != nullptr) {
    active_tier_->time_active += now - active_since_;
    ++num_switches_;
  }
  active_tier_ = next;
  active_since_ = now;
  ++next->activations;
  active_.store(next->state.get(), std::memory_order_release);
  return true;
}

bool StatePool::contains(int tier_key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tiers_.count(tier_key) != 0;
}

std::vector<int> StatePool::tiers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> out;
  out.reserve(tiers_.size());
  for (const auto& [key, tier] : tiers_) out.push_back(key);
  return out;
}

int StatePool::active_tier() const noexcept {
  const RuntimeState* state = acquire();
  return state ? state->key() : -1;
}

std::uint64_t StatePool::num_switches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_switches_;
}

std::size_t StatePool::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tiers_.size();
}

std::vector<TierStats> StatePool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  std::vector<TierStats> out;
  out.reserve(tiers_.size());
  for (const auto& [key, tier] : tiers_) {
    auto time_active = tier.time_active;
    const bool active = &tier == active_tier_;
    if (active) time_active += now - active_since_;
    out.push_back(TierStats{
        key, active, tier.activations,
        std::chrono::duration<double>(time_active).count()});
  }
  return out;
}

}  // namespace specswap
