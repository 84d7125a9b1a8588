#pragma once
// What a cached activation is: its kind and layer. LMCache's merged store keys hidden states by
// (chunk key, layer); its unmerged follow-up design (LMCache PR #3716) generalised the slot to
// (chunk key, kind, layer). hsstore keeps that axis so one pool and one per-key LRU serve every
// intermediate tensor an engine caches; the layer-only calls mean kind kHidden.
//
// Plain values: safe to copy and read from any thread.

#include <cstdint>
#include <optional>
#include <string_view>

namespace hss {

enum class ActivationKind : uint8_t { kHidden, kQuery, kKey, kValue, kMlpIntermediate };
inline constexpr int kNumActivationKinds = 5;

/// "hidden", "query", "key", "value", "mlp_intermediate"; "unknown" outside the enum.
[[nodiscard]] std::string_view to_string(ActivationKind kind);
/// The kind named by to_string's spelling, or nullopt.
[[nodiscard]] std::optional<ActivationKind> activation_kind_from_string(std::string_view name);
/// True for the five enumerators (a cast integer may be anything).
[[nodiscard]] constexpr bool is_valid(ActivationKind kind) {
  return static_cast<int>(kind) < kNumActivationKinds;  // uint8_t: never negative
}

/// One cached tensor of a chunk: (kind, layer).
struct Slot {
  ActivationKind kind = ActivationKind::kHidden;
  int64_t layer_idx = 0;

  friend bool operator==(const Slot&, const Slot&) = default;
};

}  // namespace hss
