#include "hss/activation.hpp"

#include <array>

namespace hss {
namespace {
constexpr std::array<std::string_view, kNumActivationKinds> kNames = {"hidden", "query", "key",
                                                                      "value", "mlp_intermediate"};
}  // namespace

std::string_view to_string(ActivationKind kind) {
  return is_valid(kind) ? kNames[static_cast<size_t>(kind)] : std::string_view("unknown");
}

std::optional<ActivationKind> activation_kind_from_string(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<ActivationKind>(i);
  }
  return std::nullopt;
}

}  // namespace hss
