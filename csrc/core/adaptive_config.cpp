#include "core/adaptive_config.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace specswap {
namespace {

[[noreturn]] void invalid(const std::string& key, const std::string& rule, const std::string& got) {
  throw std::invalid_argument(key + " must be " + rule + ", got " + got);
}

std::string list_words(const std::vector<int>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

// One field's check; the message is the table's valid_words().
template <class T> void check(const ConfigField<T>& field, const T& value) {
  if constexpr (std::is_enum_v<T>) {
    if (static_cast<std::size_t>(value) >= EnumNames<T>::names.size()) {
      invalid(field.name, valid_words(field), std::to_string(static_cast<int>(value)));
    }
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    for (int entry : value) {
      if (!field.bounds.contains(entry)) {
        invalid(std::string(field.name) + " entries", "integers" + bounds_words(field.bounds),
                std::to_string(entry) + " in " + list_words(value));
      }
    }
    std::vector<int> distinct = value;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    if (distinct.size() < 2) invalid(field.name, valid_words(field), list_words(value));
  } else if constexpr (std::is_same_v<T, TreeShapes>) {
    for (const TierShape& shape : value) {
      const std::string error = tree_shape_error(shape, AdaptiveConfig::kMaxSteps);
      if (!error.empty()) throw std::invalid_argument(std::string(field.name) + ": " + error);
    }
  } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string>) {
    // any value is valid (python_policy's form: validate())
  } else if constexpr (std::is_integral_v<T>) {
    if (!field.bounds.contains(value)) invalid(field.name, valid_words(field), std::to_string(value));
  } else {
    if (!(std::isfinite(value) && field.bounds.contains(value))) {
      invalid(field.name, valid_words(field), format_number(value));
    }
  }
}

}  // namespace

std::string format_number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

std::string bounds_words(const Bounds& bounds) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const bool has_low = bounds.low > -kInf, has_high = bounds.high < kInf;
  if (has_low && has_high) {
    return std::string(" in ") + (bounds.low_open ? "(" : "[") + format_number(bounds.low) + ", " +
           format_number(bounds.high) + (bounds.high_open ? ")" : "]");
  }
  if (has_low) return (bounds.low_open ? " > " : " >= ") + format_number(bounds.low);
  if (has_high) return (bounds.high_open ? " < " : " <= ") + format_number(bounds.high);
  return "";
}

template <class E> E enum_from_name(const std::string& name) {
  const auto& names = EnumNames<E>::names;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (name == names[i]) return static_cast<E>(i);
  }
  std::string valid = "one of ";
  for (std::size_t i = 0; i < names.size(); ++i) valid += (i ? ", '" : "'") + std::string(names[i]) + "'";
  invalid(EnumNames<E>::key, valid, "'" + name + "'");
}
template PolicyKind enum_from_name<PolicyKind>(const std::string&);
template AcceptanceModel enum_from_name<AcceptanceModel>(const std::string&);

const char* policy_name(PolicyKind policy) noexcept { return enum_name(policy); }
PolicyKind policy_from_name(const std::string& name) { return enum_from_name<PolicyKind>(name); }
const char* acceptance_model_name(AcceptanceModel model) noexcept { return enum_name(model); }
AcceptanceModel acceptance_model_from_name(const std::string& name) {
  return enum_from_name<AcceptanceModel>(name);
}

void AdaptiveConfig::validate() const {
  for_each_config_field([this](const auto& field) { check(field, this->*field.member); });
  if (!candidate_trees.empty() && policy == PolicyKind::kSglang) {
    throw std::invalid_argument("candidate_trees needs policy 'goodput' or 'python' (SGLang's thresholds are per "
                                "step count, not per tree), got policy 'sglang'");
  }
  if (!python_policy.empty() && policy != PolicyKind::kPython) {
    throw std::invalid_argument("python_policy names the class of policy 'python', got policy '" +
                                std::string(policy_name(policy)) + "'");
  }
  const auto colon = python_policy.find(':');
  if (!python_policy.empty() && (colon == 0 || colon == std::string::npos || colon + 1 == python_policy.size())) {
    invalid("python_policy", "'module:Class'", "'" + python_policy + "'");
  }
}

}  // namespace specswap
