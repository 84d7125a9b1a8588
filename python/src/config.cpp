// hsstore.Config: hss::Config from a dict, YAML text, a YAML file, the environment, or any object
// with LMCache's config attributes (an LMCacheEngineConfig). Every path ends in the C++ parser,
// so validation and messages are those of hss::Config::from_yaml.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <string_view>

#include "bindings.hpp"
#include "config_source.hpp"
#include "hss/activation.hpp"
#include "hss/config.hpp"
#include "hss/error.hpp"
#include "transfer_py.hpp"

namespace hss::python {

namespace {

// JSON is YAML: a dict becomes YAML text through json.dumps (values it cannot encode, such as
// torch dtypes, by their str()).
std::string to_yaml_text(nb::handle mapping) {
  nb::object json = nb::module_::import_("json");
  nb::object builtins = nb::module_::import_("builtins");
  return nb::cast<std::string>(
      json.attr("dumps")(mapping, nb::arg("default") = builtins.attr("str")));
}

bool looks_like_yaml_text(std::string_view text) {
  return text.find('\n') != std::string_view::npos || text.find(':') != std::string_view::npos ||
         text.find('{') != std::string_view::npos || text.empty();
}

}  // namespace

namespace {
hss::Config config_from_source(nb::handle source);
}  // namespace

hss::Config config_from(nb::handle source) {
  hss::Config config = config_from_source(source);
  check_transfer_available(config);
  return config;
}

namespace {

hss::Config config_from_source(nb::handle source) {
  if (source.is_none()) return hss::Config::from_env();
  if (nb::isinstance<hss::Config>(source)) return nb::cast<const hss::Config&>(source);
  if (nb::isinstance<nb::str>(source)) {
    std::string text = nb::cast<std::string>(source);
    if (looks_like_yaml_text(text)) return hss::Config::from_yaml(text);
    return hss::Config::from_file(text);
  }
  nb::object os = nb::module_::import_("os");
  if (nb::isinstance(source, os.attr("PathLike"))) {
    return hss::Config::from_file(nb::cast<std::string>(os.attr("fspath")(source)));
  }
  if (nb::isinstance<nb::dict>(source)) return hss::Config::from_yaml(to_yaml_text(source));
  // An object with LMCache's config attributes (LMCacheEngineConfig or anything alike).
  nb::dict values;
  bool found_any = false;
  for (const std::string_view key_view : hss::Config::keys()) {
    const std::string key(key_view);
    if (!nb::hasattr(source, key.c_str())) continue;
    found_any = true;
    nb::object value = source.attr(key.c_str());
    if (value.is_none()) continue;
    values[key.c_str()] = value;
  }
  if (!found_any) {
    throw hss::ConfigError(
        "config: expected None, a dict, YAML text, a path, an hsstore.Config or an object with "
        "LMCache config attributes (chunk_size, ...), got " +
        nb::cast<std::string>(nb::repr(source)));
  }
  return hss::Config::from_yaml(to_yaml_text(values));
}

}  // namespace

void bind_config(nb::module_& m) {
  auto config_class =
      nb::class_<hss::Config>(m, "Config",
                              "LMCache's configuration keys that hsstore understands, validated.")
          .def(
              "__init__",
              [](hss::Config* self, nb::handle source) {
                new (self) hss::Config(config_from(source));
              },
              nb::arg("source") = nb::none(),
              "source: None (environment: LMCACHE_CONFIG_FILE, LMCACHE_<KEY>), a dict, YAML text, "
              "a "
              "YAML file path, an hsstore.Config, or an object with LMCache config attributes.")
          .def_static("from_yaml", &hss::Config::from_yaml, nb::arg("text"))
          .def_static(
              "from_file",
              [](nb::handle path) {
                nb::object os = nb::module_::import_("os");
                return hss::Config::from_file(nb::cast<std::string>(os.attr("fspath")(path)));
              },
              nb::arg("path"))
          .def_static("from_env", &hss::Config::from_env)
          .def_static(
              "from_dict", [](nb::dict d) { return hss::Config::from_yaml(to_yaml_text(d)); },
              nb::arg("values"))
          .def_ro("unknown_keys", &hss::Config::unknown_keys)
          .def_ro("env_overrides", &hss::Config::env_overrides,
                  "The HSS_* debugging variables whose values this config holds.")
          .def_static(
              "keys",
              [] {
                std::vector<std::string> names;
                for (const std::string_view key : hss::Config::keys()) names.emplace_back(key);
                return names;
              },
              "Every key hsstore reads (each is a read-only attribute of a Config).")
          .def_static(
              "doc", [](std::string_view key) { return std::string(hss::Config::doc(key)); },
              nb::arg("key"), "A key's one-line description (README's key table).")
          .def(
              "to_dict",
              [](const hss::Config& c) {
                nb::dict d;
                nb::object self = nb::cast(c);
                for (const std::string_view key : hss::Config::keys()) {
                  const std::string name(key);
                  d[name.c_str()] = self.attr(name.c_str());
                }
                return d;
              },
              "The effective value of every key, as a dict (Config(config.to_dict()) equals it).")
          .def("to_yaml", &hss::Config::to_yaml)
          .def("layer_allowed", &hss::Config::layer_allowed, nb::arg("layer_idx"))
          .def_prop_ro("effective_copy_threads", &hss::Config::effective_copy_threads,
                       "The copy threads a store built with this config on this thread gets: "
                       "hidden_state_copy_threads, or what `auto` (None) chooses here.")
          .def("__repr__", [](const hss::Config& c) {
            return "hsstore.Config(\"\"\"\n" + c.to_yaml() + "\"\"\")";
          });
  // One read-only attribute per row of the key table (src/config/config_keys.cpp), named as the key,
  // with its doc line: a key added there is an attribute here (python/hsstore/_hsstore.pyi lists
  // them; test_stubs checks that it does). The names are string literals of the table, so they
  // outlive the module.
  for (const std::string_view key : hss::Config::keys()) {
    config_class.def_prop_ro(
        key.data(), [key](const hss::Config& c) { return c.value(key); },
        hss::Config::doc(key).data());
  }
}

}  // namespace hss::python
