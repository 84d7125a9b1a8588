#pragma once
// Shared declarations of the hsstore._hsstore extension module. One bind_* function per concept,
// each in the .cpp file of the same name.

#include <nanobind/nanobind.h>

namespace hss::python {

namespace nb = nanobind;

void bind_errors(nb::module_& m);
void bind_config(nb::module_& m);
void bind_keys(nb::module_& m);
void bind_tensor(nb::module_& m);
void bind_store(nb::module_& m);
void bind_engine(nb::module_& m);
void bind_bench(nb::module_& m);
void bind_device_buffer(nb::module_& m);
void bind_transfer(nb::module_& m);

}  // namespace hss::python
