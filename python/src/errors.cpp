// hsstore.Error (RuntimeError), hsstore.ConfigError and hsstore.InvalidArgument (both also
// ValueError, so LMCache callers' `except ValueError` keeps working) and the translation of the
// C++ exceptions into them.
#include <Python.h>

#include "bindings.hpp"
#include "hss/error.hpp"

namespace hss::python {

namespace {

// The exception types live as long as the module (attributes of it); the translator only borrows.
PyObject* g_error = nullptr;
PyObject* g_config_error = nullptr;
PyObject* g_invalid_argument = nullptr;

PyObject* new_exception(const char* qualified_name, PyObject* bases, const char* doc) {
  PyObject* type = PyErr_NewExceptionWithDoc(qualified_name, doc, bases, nullptr);
  if (type == nullptr) throw nb::python_error();
  return type;
}

}  // namespace

void bind_errors(nb::module_& m) {
  g_error = new_exception("hsstore.Error", PyExc_RuntimeError,
                          "A runtime failure inside hsstore (CUDA errors included).");
  nb::object value_error_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError));
  g_config_error = new_exception("hsstore.ConfigError", value_error_bases.ptr(),
                                 "A configuration value that cannot be used (a ValueError).");
  g_invalid_argument =
      new_exception("hsstore.InvalidArgument", value_error_bases.ptr(),
                    "A bad argument; the message names it and its value (a ValueError). "
                    "Nothing was changed.");
  m.attr("Error") = nb::handle(g_error);
  m.attr("ConfigError") = nb::handle(g_config_error);
  m.attr("InvalidArgument") = nb::handle(g_invalid_argument);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const hss::ConfigError& e) {
      PyErr_SetString(g_config_error, e.what());
    } catch (const hss::InvalidArgument& e) {
      PyErr_SetString(g_invalid_argument, e.what());
    } catch (const hss::Error& e) {
      PyErr_SetString(g_error, e.what());
    }
  });
}

}  // namespace hss::python
