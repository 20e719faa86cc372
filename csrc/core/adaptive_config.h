// AdaptiveConfig: the adaptive policy's settings, their valid ranges and
// their names, all generated from the one table in adaptive_config_fields.h.
// Plain C++20: a serving loop without Python builds and validates it alike.
#pragma once

#include <array>
#include <cstddef>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/adaptive_config_fields.h"
#include "core/tier_key.h"

namespace specswap {

using TreeShapes = std::vector<TierShape>;

inline constexpr int kMaxAdaptiveSteps = 64;

enum class PolicyKind { kSglang, kGoodput, kPython };
// goodput's acceptance model: one alpha for every draft position (geometric,
// the default) or one acceptance rate per draft position (positional).
enum class AcceptanceModel { kGeometric, kPositional };

// The names of a choice, in enumerator order (the enumerators are 0..n-1).
template <class E> struct EnumNames;
template <> struct EnumNames<PolicyKind> {
  static constexpr std::array<const char*, 3> names{"sglang", "goodput", "python"};
  static constexpr const char* key = "policy";
};
template <> struct EnumNames<AcceptanceModel> {
  static constexpr std::array<const char*, 2> names{"geometric", "positional"};
  static constexpr const char* key = "acceptance_model";
};

// The name of a value ("?" for one outside the enumeration).
template <class E> const char* enum_name(E value) noexcept {
  const auto index = static_cast<std::size_t>(value);
  return index < EnumNames<E>::names.size() ? EnumNames<E>::names[index] : "?";
}
// Throws std::invalid_argument naming the key, the valid names and the bad one.
template <class E> E enum_from_name(const std::string& name);

const char* policy_name(PolicyKind policy) noexcept;
PolicyKind policy_from_name(const std::string& name);
const char* acceptance_model_name(AcceptanceModel model) noexcept;
AcceptanceModel acceptance_model_from_name(const std::string& name);

// A field's valid range: [low, high], either end open or infinite.
struct Bounds {
  double low = -std::numeric_limits<double>::infinity();
  double high = std::numeric_limits<double>::infinity();
  bool low_open = false;
  bool high_open = false;

  static constexpr Bounds at_least(double low) { return Bounds{low, std::numeric_limits<double>::infinity()}; }
  static constexpr Bounds closed(double low, double high) { return Bounds{low, high}; }
  static constexpr Bounds open_closed(double low, double high) { return Bounds{low, high, true, false}; }
  constexpr bool contains(double value) const noexcept {
    return (low_open ? value > low : value >= low) && (high_open ? value < high : value <= high);
  }
};

struct AdaptiveConfig {
#define SPECSWAP_CONFIG_MEMBER(type, name, default_value, bounds, doc) type name = default_value;
  SPECSWAP_ADAPTIVE_CONFIG_FIELDS(SPECSWAP_CONFIG_MEMBER)
#undef SPECSWAP_CONFIG_MEMBER

  static constexpr int kMaxSteps = kMaxAdaptiveSteps;

  // Throws std::invalid_argument naming the key, the bad value and the valid
  // range (the words of valid_words()).
  void validate() const;
};

// One row of the table, for code that walks every field (bindings, schema).
template <class T> struct ConfigField {
  using type = T;
  const char* name;
  T AdaptiveConfig::*member;
  Bounds bounds;
  const char* doc;
};

#define SPECSWAP_CONFIG_DESCRIPTOR(type, name, default_value, bounds, doc) \
  ConfigField<type>{#name, &AdaptiveConfig::name, bounds, doc},
inline constexpr std::tuple kAdaptiveConfigFields{SPECSWAP_ADAPTIVE_CONFIG_FIELDS(SPECSWAP_CONFIG_DESCRIPTOR)};
#undef SPECSWAP_CONFIG_DESCRIPTOR

// Calls f(field) for every row, in table order.
template <class F> void for_each_config_field(F&& f) {
  std::apply([&](const auto&... field) { (f(field), ...); }, kAdaptiveConfigFields);
}

// What a field's kind is called in the schema: choice, steps, trees, text, integer, number or bool.
template <class T> constexpr const char* field_kind() {
  if constexpr (std::is_enum_v<T>) return "choice";
  else if constexpr (std::is_same_v<T, std::string>) return "text";
  else if constexpr (std::is_same_v<T, std::vector<int>>) return "steps";
  else if constexpr (std::is_same_v<T, TreeShapes>) return "trees";
  else if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_integral_v<T>) return "integer";
  else return "number";
}

// A number as the messages print it (shortest form: 0.2, 64, inf).
std::string format_number(double value);
// " in (0, 1]", " >= 1", " in [0, 64]", or "" for no bounds.
std::string bounds_words(const Bounds& bounds);

// The valid values in words, e.g. "a number in (0, 1]", "an integer >= 1",
// "one of 'sglang', 'goodput'"; validate() and config.py both say these.
template <class T> std::string valid_words(const ConfigField<T>& field) {
  if constexpr (std::is_enum_v<T>) {
    std::string out = "one of ";
    for (std::size_t i = 0; i < EnumNames<T>::names.size(); ++i) {
      out += (i ? ", '" : "'") + std::string(EnumNames<T>::names[i]) + "'";
    }
    return out;
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    return "a list of at least two distinct integers" + bounds_words(field.bounds);
  } else if constexpr (std::is_same_v<T, TreeShapes>) {
    return "a list of [speculative_num_steps in [1, " + std::to_string(kMaxAdaptiveSteps) +
           "], speculative_eagle_topk in [2, 99], speculative_num_draft_tokens in [steps + 1, 1 + topk + "
           "(steps - 1) * topk^2], at most 99] trees";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "a string";
  } else if constexpr (std::is_same_v<T, bool>) {
    return "true or false";
  } else if constexpr (std::is_integral_v<T>) {
    return "an integer" + bounds_words(field.bounds);
  } else {
    const bool bounded = field.bounds.low > -std::numeric_limits<double>::infinity() &&
                         field.bounds.high < std::numeric_limits<double>::infinity();
    return (bounded ? "a number" : "a finite number") + bounds_words(field.bounds);
  }
}

}  // namespace specswap
