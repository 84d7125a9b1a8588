#pragma once
// hss::TokenIds: the token-list parameter of the public calls (HiddenStateStore, Engine): a
// read-only view of 32- or 64-bit token ids.
//
// A view, like std::span: it owns nothing, and the ids must outlive the call it is passed to. It
// converts implicitly from any contiguous sized range of int32_t or int64_t (std::span,
// std::vector, std::array, a C array), so a caller passes what it holds. The ids keep the width
// they were given in: making the view copies and widens nothing, and the call hands each width to
// the token database's own overload (ChunkedTokenDatabase hashes int32 ids in place and narrows
// int64 ids per chunk). TokenDatabase itself keeps one overload per width: its implementations
// override both.
// Which values are valid is the token database's rule (ChunkedTokenDatabase: [0, 2^32), else
// InvalidArgument naming token_ids[i]).
//
// Thread safety: a plain value (docs/design.md, "What may run concurrently and what may block the
// host").

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <type_traits>

namespace hss {

/// The element types token ids may have.
template <typename T>
concept TokenId = std::same_as<T, int32_t> || std::same_as<T, int64_t>;

class TokenIds {
 public:
  /// No ids. User-provided, so that `const TokenIds none;` compiles with every compiler (clang 14
  /// does not treat the anonymous union's initializer as making the class const-default-
  /// constructible).
  constexpr TokenIds() noexcept {}  // NOLINT(modernize-use-equals-default)
  constexpr TokenIds(std::span<const int32_t> ids) noexcept  // NOLINT(google-explicit-constructor)
      : i32_(ids.data()), size_(ids.size()), is_int32_(true) {}
  constexpr TokenIds(std::span<const int64_t> ids) noexcept  // NOLINT(google-explicit-constructor)
      : i64_(ids.data()), size_(ids.size()), is_int32_(false) {}
  /// Any contiguous sized range of int32_t or int64_t: std::vector, std::array, a C array...
  // (clang-format 14 would join the requires-clause to the constructor's declaration.)
  // clang-format off
  template <std::ranges::contiguous_range Range>
    requires std::ranges::sized_range<Range> && TokenId<std::ranges::range_value_t<Range>> &&
             (!std::same_as<std::remove_cvref_t<Range>, TokenIds>)
  constexpr TokenIds(Range&& ids) noexcept  // NOLINT(google-explicit-constructor)
      : TokenIds(std::span<const std::ranges::range_value_t<Range>>(std::ranges::data(ids),
                                                                    std::ranges::size(ids))) {}
  // clang-format on

  [[nodiscard]] constexpr size_t size() const noexcept { return size_; }
  [[nodiscard]] constexpr bool empty() const noexcept { return size_ == 0; }
  /// True when the ids are 32-bit (the width they were given in).
  [[nodiscard]] constexpr bool is_int32() const noexcept { return is_int32_; }

  /// Calls f with the ids at their own width: f(std::span<const int32_t>) or
  /// f(std::span<const int64_t>). Both calls must return the same type.
  template <typename F>
  constexpr decltype(auto) visit(F&& f) const {
    if (is_int32_) return f(std::span<const int32_t>(i32_, size_));
    return f(std::span<const int64_t>(i64_, size_));
  }

 private:
  union {
    const int32_t* i32_;
    const int64_t* i64_ = nullptr;
  };
  size_t size_ = 0;
  bool is_int32_ = false;
};

}  // namespace hss
