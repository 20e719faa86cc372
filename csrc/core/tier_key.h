// A tier's shape and its key. A tier is (speculative_num_steps: the draft
// depth, speculative_eagle_topk: children per expanded node, 1 for a chain,
// speculative_num_draft_tokens: tokens verified, the root included), as
// SGLang names them. The state pool and the policies know a tier by one int:
// a chain's key is its step count (what it always was), a tree's encodes its
// shape, steps * 10000 + topk * 100 + tokens, so it never meets a chain's.
#pragma once

#include <array>
#include <string>

namespace specswap {

using TierShape = std::array<int, 3>;  // speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens

inline constexpr int kTreeKeyScale = 10000;
inline constexpr int kMaxTreeField = 99;  // topk and tokens fit two decimal digits of the key

constexpr int tier_key(const TierShape& shape) noexcept {
  return shape[1] <= 1 ? shape[0] : shape[0] * kTreeKeyScale + shape[1] * 100 + shape[2];
}

constexpr TierShape tier_shape(int key) noexcept {
  if (key < kTreeKeyScale) return {key, 1, key + 1};
  return {key / kTreeKeyScale, key / 100 % 100, key % 100};
}

constexpr bool is_tree_key(int key) noexcept { return key >= kTreeKeyScale; }

// Verified drafts: where a tier sits among the others (its cost grows with them).
constexpr int tier_width(int key) noexcept { return tier_shape(key)[2] - 1; }

// Why a tree shape is invalid ("" if it is valid): depth in [1, max_steps],
// topk in [2, 99], tokens in [steps + 1, 1 + topk + (steps - 1) * topk^2] and <= 99.
inline std::string tree_shape_error(const TierShape& shape, int max_steps) {
  const int steps = shape[0], topk = shape[1], tokens = shape[2];
  auto text = [&] {
    return "[" + std::to_string(steps) + ", " + std::to_string(topk) + ", " + std::to_string(tokens) + "]";
  };
  if (steps < 1 || steps > max_steps) {
    return "tree " + text() + ": speculative_num_steps must be in [1, " + std::to_string(max_steps) + "]";
  }
  if (topk < 2 || topk > kMaxTreeField) return "tree " + text() + ": speculative_eagle_topk must be in [2, 99]";
  const long long most = 1LL + topk + static_cast<long long>(steps - 1) * topk * topk;
  const long long high = most < kMaxTreeField ? most : kMaxTreeField;
  if (tokens < steps + 1 || tokens > high) {
    return "tree " + text() + ": speculative_num_draft_tokens must be in [" + std::to_string(steps + 1) + ", " +
           std::to_string(high) + "]";
  }
  return "";
}

}  // namespace specswap
