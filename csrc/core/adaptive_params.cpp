#include "core/adaptive_params.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace specswap {
namespace {

std::string format_double(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

[[noreturn]] void invalid(const std::string& key, const std::string& rule,
                          const std::string& got) {
  throw std::invalid_argument(key + " must be " + rule + ", got " + got);
}

std::vector<int> sorted_unique(std::vector<int> steps) {
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

}  // namespace

void AdaptiveConfig::validate() const {
  for (int steps : candidate_steps) {
    if (steps < 0 || steps > kMaxSteps) {
      invalid("candidate_steps entries",
              "integers in [0, " + std::to_string(kMaxSteps) + "]",
              std::to_string(steps));
    }
  }
  if (sorted_unique(candidate_steps).size() < 2) {
    std::ostringstream got;
    got << "[";
    for (std::size_t i = 0; i < candidate_steps.size(); ++i) {
      got << (i ? ", " : "") << candidate_steps[i];
    }
    got << "]";
    invalid("candidate_steps", "at least two distinct step counts", got.str());
  }
  if (!(ema_alpha > 0.0 && ema_alpha <= 1.0)) {
    invalid("ema_alpha", "in (0, 1]", format_double(ema_alpha));
  }
  if (update_interval < 1) {
    invalid("update_interval", ">= 1", std::to_string(update_interval));
  }
  if (warmup_batches < 0) {
    invalid("warmup_batches", ">= 0", std::to_string(warmup_batches));
  }
  if (!std::isfinite(down_hysteresis)) {
    invalid("down_hysteresis", "a finite number", format_double(down_hysteresis));
  }
  if (!std::isfinite(up_hysteresis)) {
    invalid("up_hysteresis", "a finite number", format_double(up_hysteresis));
  }
}

AdaptiveSpeculativeParams::AdaptiveSpeculativeParams(int initial_steps,
                                                     AdaptiveConfig config)
    : config_(std::move(config)) {
  config_.validate();
  if (initial_steps < 0 || initial_steps > AdaptiveConfig::kMaxSteps) {
    invalid("initial_steps",
            "an integer in [0, " + std::to_string(AdaptiveConfig::kMaxSteps) + "]",
            std::to_string(initial_steps));
  }
  candidates_ = sorted_unique(config_.candidate_steps);
  if (config_.snap_initial_steps) {
    // Nearest candidate; on a tie the larger one wins.
    std::size_t best = 0;
    for (std::size_t i = 1; i < candidates_.size(); ++i) {
      if (std::abs(candidates_[i] - initial_steps) <=
          std::abs(candidates_[best] - initial_steps)) {
        best = i;
      }
    }
    index_ = best;
  } else {
    auto it = std::lower_bound(candidates_.begin(), candidates_.end(),
                               initial_steps);
    if (it == candidates_.end() || *it != initial_steps) {
      it = candidates_.insert(it, initial_steps);
    }
    index_ = static_cast<std::size_t>(it - candidates_.begin());
  }
  ema_ = static_cast<double>(current_steps() - 1);
}

bool AdaptiveSpeculativeParams::update(std::span<const int> accept_lengths) {
  // Idle batches neither move the EMA nor use up warmup.
  if (accept_lengths.empty()) return false;
  long long total = 0;
  for (int accepted : accept_lengths) total += accepted;
  const double batch_mean =
      static_cast<double>(total) / static_cast<double>(accept_lengths.size());
  ema_ = (1.0 - config_.ema_alpha) * ema_ + config_.ema_alpha * batch_mean;

  ++num_batches_;
  const auto warmup = static_cast<std::uint64_t>(config_.warmup_batches);
  if (num_batches_ <= warmup) return false;
  if ((num_batches_ - warmup) % static_cast<std::uint64_t>(config_.update_interval) != 0) {
    return false;
  }
  const std::size_t before = index_;
  recompute();
  return index_ != before;
}

void AdaptiveSpeculativeParams::recompute() {
  // A tier of k drafts pays off once about k - 0.5 of them are accepted on
  // average; the hysteresis terms widen that band so the tier does not flap.
  while (index_ > 0 &&
         ema_ <= candidates_[index_ - 1] - 0.5 + config_.down_hysteresis) {
    --index_;
  }
  while (index_ + 1 < candidates_.size() &&
         ema_ > candidates_[index_] - 0.5 + config_.up_hysteresis) {
    ++index_;
  }
}

}  // namespace specswap
