#include "core/policy.h"

#include <stdexcept>

#include "core/goodput_policy.h"
#include "core/sglang_policy.h"

namespace specswap {

ModelFreePolicy::ModelFreePolicy(const AdaptiveConfig& config, const std::vector<int>& candidates,
                                 std::size_t index)
    : priors_(std::make_unique<GoodputPolicy>(config, candidates, index)) {}

ModelFreePolicy::~ModelFreePolicy() = default;

void ModelFreePolicy::set_row_costs(const RowCosts& row_costs) { priors_->set_row_costs(row_costs); }

void ModelFreePolicy::expect_shadows() noexcept { priors_->expect_shadows(); }

std::unique_ptr<Policy> make_policy(const AdaptiveConfig& config, const std::vector<int>& candidates,
                                    std::size_t index) {
  switch (config.policy) {
    case PolicyKind::kSglang:
      return std::make_unique<SglangPolicy>(config, candidates, index);
    case PolicyKind::kGoodput:
      return std::make_unique<GoodputPolicy>(config, candidates, index);
    case PolicyKind::kPython:
      break;
  }
  throw std::invalid_argument(std::string("policy '") + policy_name(config.policy) +
                              "' is written in Python: give the policy (AdaptiveController builds it from "
                              "python_policy; a C++ caller passes its own Policy)");
}

}  // namespace specswap
