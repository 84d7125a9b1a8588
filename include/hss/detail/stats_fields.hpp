#pragma once
// The field lists of the stats structs (HiddenStateStats and the structs inside it): each field is
// named once, beside its struct, by a function
//
//   template <detail::MaybeConst<RemoteStats> Self, class Visit>
//   constexpr void for_each_field(Self& s, Visit&& visit) {
//     visit("enabled", s.enabled);  // visit(const char* name, field&), once per field
//     ...
//   }
//
// found by argument-dependent lookup, for a const or a mutable struct. The name is the member's
// own, and the order is the order stats() reports them in (the Python dict's; for four fields of
// HiddenStateStats that is not the declaration order, and a list never reorders a field that
// shipped). The Python dict (python/src/store.cpp) is built from the lists; the type stub
// (python/hsstore/_hsstore.pyi, a TypedDict per struct) and docs/stats.md are checked against
// them by tests/base/test_stats_fields.cpp, which also checks that a list names every member of
// its struct exactly once. The shapes a field may have (anything else does not compile in the
// dict builder), and what each is in Python:
//   bool, an integer, a floating-point number, std::string: bool, int, float, str
//   an enum with a to_string() overload: str
//   a struct with a field list (HasFieldList): a dict of its fields
//   std::array<T, kNumActivationKinds> indexed by ActivationKind (PerKindField): a dict keyed by
//     to_string(kind)
//   std::vector<T> (ListField): a list
//
// Adding a field: declare the member and add its line to the struct's list. The dict follows; the
// tests name the stub line and the docs/stats.md row to add. Adding a struct (TierStats, say):
//   1. declare it in its header, with its list after it, as above (MaybeConst<TierStats>);
//   2. give HiddenStateStats (or a struct inside it) a member of it, a std::array of it per kind
//      or a std::vector of it, and add that member's line to that struct's list;
//   3. add a TypedDict class to the stub and the rows to docs/stats.md, as the tests say.
// Nothing else changes: the dict builder and the tests walk the lists.
//
// Thread safety: compile-time vocabulary only.

#include <array>
#include <concepts>
#include <type_traits>
#include <vector>

#include "hss/activation.hpp"

namespace hss::detail {

/// Stats or const Stats: constrains a struct's for_each_field to that struct.
template <class Self, class Stats>
concept MaybeConst = std::same_as<std::remove_const_t<Self>, Stats>;

/// A visitor accepting any field, to ask whether a type has a field list.
struct AnyFieldVisitor {
  template <class Field>
  constexpr void operator()(const char* /*name*/, const Field& /*value*/) const {}
};

/// A struct with a field list (a dict in Python).
template <class T>
concept HasFieldList = requires(const T& s) {
  for_each_field(s, AnyFieldVisitor{});
};

template <class T>
struct PerKindTraits : std::false_type {};
template <class T>
struct PerKindTraits<std::array<T, kNumActivationKinds>> : std::true_type {};

/// An array indexed by ActivationKind (a dict keyed by to_string(kind) in Python).
template <class T>
concept PerKindField = PerKindTraits<T>::value;

template <class T>
struct ListTraits : std::false_type {};
template <class T, class Alloc>
struct ListTraits<std::vector<T, Alloc>> : std::true_type {};

/// A list of values in an order of its own (a list in Python).
template <class T>
concept ListField = ListTraits<T>::value;

}  // namespace hss::detail
