// The stats structs' field lists (hss/detail/stats_fields.hpp) against the structs themselves and
// against what is written from them elsewhere: each list names every member of its struct once,
// the stub's TypedDicts (python/hsstore/_hsstore.pyi) declare the same fields with the types the
// dict gives them, and docs/stats.md has one row per field, in the lists' order. A failure says
// the line to add or remove. (python/tests/test_stats_stub.py checks the live dict against the
// stub.)
#include <cxxabi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "hss/detail/stats_fields.hpp"
#include "hss/hidden_state_store.hpp"

namespace hss {
namespace {

using detail::HasFieldList;
using detail::ListField;
using detail::PerKindField;

// --- Every member once -------------------------------------------------------------------------

/// Converts to any member type, in unevaluated braced initializers only.
struct AnyMember {
  template <class T>
  operator T&() const&&;  // NOLINT(google-explicit-constructor): declared, never defined
};

template <class T, size_t... I>
constexpr bool brace_initializable(std::index_sequence<I...> /*unused*/) {
  return requires { T{(void(I), AnyMember{})...}; };
}

/// The members of aggregate T: the most initializers T{...} accepts.
template <class T, size_t N = 0>
constexpr size_t member_count() {
  if constexpr (brace_initializable<T>(std::make_index_sequence<N + 1>{})) {
    return member_count<T, N + 1>();
  } else {
    return N;
  }
}

struct Probe {
  int a = 0;
  std::string b;
  std::array<int, 3> c{};
  std::vector<int> d;
  bool e = false;
};
static_assert(member_count<Probe>() == 5);
static_assert(member_count<KindStats>() == 3);

/// The element type of a per-kind array or a list field.
template <class F>
using Element = typename F::value_type;

/// A struct's name, as its TypedDict has it: "hss::RemoteStats" -> "RemoteStats".
template <class S>
std::string typed_dict_name() {
  int status = 0;
  char* demangled = abi::__cxa_demangle(typeid(S).name(), nullptr, nullptr, &status);
  std::string name = status == 0 ? demangled : typeid(S).name();
  std::free(demangled);  // NOLINT(cppcoreguidelines-no-malloc): __cxa_demangle's contract
  return name.substr(name.rfind(':') + 1);
}

/// Calls f.template operator()<S>() for S and every struct with a field list inside it.
template <class S, class F>
void for_each_stats_struct(F&& f) {
  f.template operator()<S>();
  const S s{};
  for_each_field(s, [&f]<class Field>(const char* /*name*/, const Field& /*value*/) {
    if constexpr (HasFieldList<Field>) {
      for_each_stats_struct<Field>(f);
    } else if constexpr (PerKindField<Field> || ListField<Field>) {
      if constexpr (HasFieldList<Element<Field>>) for_each_stats_struct<Element<Field>>(f);
    }
  });
}

/// The names of S's list, in order.
template <class S>
std::vector<std::string> field_names() {
  std::vector<std::string> names;
  const S s{};
  for_each_field(s,
                 [&names](const char* name, const auto& /*value*/) { names.emplace_back(name); });
  return names;
}

TEST(StatsFields, EachListNamesEveryMemberOfItsStructOnce) {
  int structs = 0;
  for_each_stats_struct<HiddenStateStats>([&structs]<class S>() {
    ++structs;
    const S s{};
    const auto* begin = reinterpret_cast<const std::byte*>(&s);
    std::vector<std::pair<const std::byte*, size_t>> spans;  // each visited member's bytes
    for_each_field(s, [&spans](const char* /*name*/, const auto& member) {
      spans.emplace_back(reinterpret_cast<const std::byte*>(&member), sizeof(member));
    });
    const std::vector<std::string> names = field_names<S>();
    const std::set<std::string> distinct(names.begin(), names.end());
    EXPECT_EQ(distinct.size(), names.size())
        << "a name twice in the list of " << typed_dict_name<S>() << ": the dict would keep one";
    // As many visits as members, none outside the struct, no two on the same member: the list
    // names every member once.
    EXPECT_EQ(spans.size(), member_count<S>())
        << "the list of " << typed_dict_name<S>() << " names " << spans.size()
        << " fields, the struct has " << member_count<S>()
        << " members: add the new member's line (hss/detail/stats_fields.hpp)";
    std::ranges::sort(spans);
    for (size_t i = 0; i < spans.size(); ++i) {
      EXPECT_GE(spans[i].first, begin);
      EXPECT_LE(spans[i].first + spans[i].second, begin + sizeof(S));
      if (i > 0) {
        EXPECT_GE(spans[i].first, spans[i - 1].first + spans[i - 1].second);
      }
    }
  });
  EXPECT_GE(structs, 5);  // HiddenStateStats, KindStats, RemoteStats, TransferStats, HostCopyStats
}

TEST(StatsFields, AMutableStructIsVisitedThroughTheSameList) {
  RemoteStats r;
  for_each_field(r, [](const char* /*name*/, auto& value) {
    if constexpr (std::same_as<std::remove_cvref_t<decltype(value)>, uint64_t>) value = 7;
  });
  EXPECT_EQ(r.hits, 7u);
  EXPECT_EQ(r.queue_bytes, 7u);
  EXPECT_FALSE(r.enabled);
}

// --- The Python types --------------------------------------------------------------------------

/// The stub's (and the table's) type of a field that is a single value.
template <class F>
std::string python_scalar() {
  if constexpr (std::same_as<F, bool>) {
    return "bool";
  } else if constexpr (std::is_integral_v<F>) {
    return "int";
  } else if constexpr (std::is_floating_point_v<F>) {
    return "float";
  } else {
    static_assert(std::is_enum_v<F> || std::same_as<F, std::string>);
    return "str";
  }
}

std::string read_source(const std::string& relative) {
  std::ifstream in(std::string(HSS_SOURCE_DIR) + "/" + relative);
  EXPECT_TRUE(in) << "cannot read " << relative << " under " << HSS_SOURCE_DIR;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// --- The stub ----------------------------------------------------------------------------------

constexpr const char* kStub = "python/hsstore/_hsstore.pyi";

using Fields = std::vector<std::pair<std::string, std::string>>;  // (name, annotation)
using StubClasses = std::map<std::string, Fields>;

/// The stub's `class Name(TypedDict):` blocks: each field's name and annotation, comments dropped.
StubClasses stub_typed_dicts() {
  StubClasses classes;
  std::istringstream in(read_source(kStub));
  const std::regex header(R"(^class (\w+)\(TypedDict\):\s*$)");
  const std::regex field(R"(^    (\w+): ([^#]*[^#\s])\s*(#.*)?$)");
  std::string line;
  Fields* current = nullptr;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, header)) {
      current = &classes[m[1]];
    } else if (current != nullptr && std::regex_match(line, m, field)) {
      current->emplace_back(m[1], m[2]);
    } else if (line.rfind("    ", 0) != 0) {
      current = nullptr;
    }
  }
  return classes;
}

/// The stub's annotation of a field of type F.
template <class F>
std::string annotation_of() {
  if constexpr (HasFieldList<F>) {
    return typed_dict_name<F>();
  } else if constexpr (PerKindField<F>) {
    return "Dict[str, " + annotation_of<Element<F>>() + "]";
  } else if constexpr (ListField<F>) {
    return "List[" + annotation_of<Element<F>>() + "]";
  } else {
    return python_scalar<F>();
  }
}

/// The stub's TypedDicts as they should read: HiddenStateStats's and every struct's inside it.
StubClasses want_typed_dicts() {
  StubClasses want;
  for_each_stats_struct<HiddenStateStats>([&want]<class S>() {
    Fields& fields = want[typed_dict_name<S>()];
    if (!fields.empty()) return;  // a struct met twice
    const S s{};
    for_each_field(s, [&fields]<class Field>(const char* name, const Field& /*value*/) {
      fields.emplace_back(name, annotation_of<Field>());
    });
  });
  return want;
}

std::string typed_dict_text(const std::string& name, const Fields& fields) {
  std::string text = "class " + name + "(TypedDict):\n";
  for (const auto& [field, annotation] : fields) text += "    " + field + ": " + annotation + "\n";
  return text;
}

TEST(StatsFields, StubTypedDictsDeclareTheLists) {
  const StubClasses want = want_typed_dicts();
  const StubClasses have = stub_typed_dicts();
  for (const auto& [name, fields] : want) {
    const auto found = have.find(name);
    if (found == have.end()) {
      ADD_FAILURE() << kStub << " lacks the TypedDict of hss::" << name << ":\n"
                    << typed_dict_text(name, fields);
    } else if (found->second != fields) {
      size_t i = 0;
      while (i < fields.size() && i < found->second.size() && fields[i] == found->second[i]) ++i;
      const std::string line =
          i < fields.size() ? fields[i].first + ": " + fields[i].second : "(no more fields)";
      ADD_FAILURE() << kStub << ": in class " << name << ", field " << i + 1 << " should be `"
                    << line << "`; the whole class, as the C++ list has it:\n"
                    << typed_dict_text(name, fields);
    }
  }
  for (const auto& [name, fields] : have) {
    EXPECT_TRUE(want.contains(name))
        << kStub << ": TypedDict " << name << " is no stats struct inside HiddenStateStats";
  }
  EXPECT_GE(want.size(), 5u);
}

// --- docs/stats.md -----------------------------------------------------------------------------

constexpr const char* kDocs = "docs/stats.md";

struct DocRow {
  std::string path, type;
  friend bool operator==(const DocRow&, const DocRow&) = default;
};

/// The rows S's fields make: leaves only, named by their path in the dict.
template <class S>
void append_rows(const std::string& prefix, std::vector<DocRow>& rows) {
  const S s{};
  for_each_field(s, [&]<class Field>(const char* name, const Field& /*value*/) {
    const std::string path = prefix + name;
    if constexpr (HasFieldList<Field>) {
      append_rows<Field>(path + ".", rows);
    } else if constexpr (PerKindField<Field> || ListField<Field>) {
      const std::string item = path + (PerKindField<Field> ? ".<kind>" : "[i]");
      if constexpr (HasFieldList<Element<Field>>) {
        append_rows<Element<Field>>(item + ".", rows);
      } else {
        rows.push_back({item, python_scalar<Element<Field>>()});
      }
    } else {
      rows.push_back({path, python_scalar<Field>()});
    }
  });
}

/// The rows of docs/stats.md's "## Fields" tables: "| `path` | type | meaning |".
std::vector<DocRow> doc_rows() {
  std::istringstream in(read_source(kDocs));
  std::string line;
  while (std::getline(in, line) && line != "## Fields") {
  }
  std::vector<DocRow> rows;
  const std::regex row(R"(^\| `([^`]+)` \| (\w+) \| .*\|$)");
  std::smatch m;
  while (std::getline(in, line) && line.rfind("## ", 0) != 0) {
    if (std::regex_match(line, m, row)) rows.push_back({m[1], m[2]});
  }
  return rows;
}

std::string doc_row(const DocRow& r) { return "| `" + r.path + "` | " + r.type + " | ... |"; }

TEST(StatsFields, DocsTableHasARowPerField) {
  std::vector<DocRow> want;
  append_rows<HiddenStateStats>("", want);
  const std::vector<DocRow> have = doc_rows();
  for (size_t i = 0; i < std::max(want.size(), have.size()); ++i) {
    if (i < want.size() && i < have.size() && want[i] == have[i]) continue;
    if (i < want.size()) {
      const bool elsewhere = std::ranges::find(have, want[i]) != have.end();
      ADD_FAILURE() << kDocs << " row " << i + 1 << " of the Fields table should be\n"
                    << doc_row(want[i]) << (elsewhere ? "\n(it is further down)" : "")
                    << (i > 0 ? "\nafter the row of `" + want[i - 1].path + "`" : "");
    } else {
      ADD_FAILURE() << kDocs << ": no field is " << doc_row(have[i]) << ": remove it";
    }
    break;  // the first difference: the rest shifts with it
  }
  EXPECT_EQ(want.size(), have.size());
  EXPECT_GT(want.size(), 70u);
}

}  // namespace
}  // namespace hss
