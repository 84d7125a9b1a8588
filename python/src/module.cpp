// hsstore._hsstore: the extension module behind the Python package hsstore.
#include "bindings.hpp"

NB_MODULE(_hsstore, m) {
  m.doc() = "hsstore native module: use the package hsstore, which re-exports this API";
  hss::python::bind_errors(m);
  hss::python::bind_config(m);
  hss::python::bind_keys(m);
  hss::python::bind_tensor(m);
  hss::python::bind_store(m);
  hss::python::bind_engine(m);
  hss::python::bind_bench(m);
  hss::python::bind_device_buffer(m);
  hss::python::bind_transfer(m);
}
