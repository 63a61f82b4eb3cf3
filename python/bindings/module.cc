// specd._core: pybind11 module of the specd C++ core.
#include <pybind11/pybind11.h>

#ifdef SPECD_WITH_CUDA
#include "specd/cuda/runtime.h"
#endif

namespace py = pybind11;

namespace specd::py_bind {
void bind_block_manager(py::module_& m);
void bind_kv(py::module_& m);
void bind_kv_kernels(py::module_& m);
void bind_kv_ops(py::module_& m);
void bind_layer_ops(py::module_& m);
void bind_spec_kernels(py::module_& m);
void bind_spec(py::module_& m);
void bind_proposers(py::module_& m);
void bind_controller(py::module_& m);
}  // namespace specd::py_bind

PYBIND11_MODULE(_core, m) {
  m.doc() = "specd C++ core: KV block manager, token trees, proposers, sampling and verification.";
  m.attr("__version__") = SPECD_VERSION;
#ifdef SPECD_WITH_CUDA
  m.attr("built_with_cuda") = true;
  m.def("cuda_device_count", &specd::cuda::device_count,
        "Number of usable CUDA devices (0 without a driver or device).");
#else
  m.attr("built_with_cuda") = false;
  m.def("cuda_device_count", [] { return 0; },
        "Number of usable CUDA devices: always 0, this build has no CUDA kernels.");
#endif
  specd::py_bind::bind_block_manager(m);
  specd::py_bind::bind_kv(m);
  specd::py_bind::bind_kv_kernels(m);
  specd::py_bind::bind_kv_ops(m);
  specd::py_bind::bind_layer_ops(m);
  specd::py_bind::bind_spec_kernels(m);
  specd::py_bind::bind_spec(m);
  specd::py_bind::bind_proposers(m);
  specd::py_bind::bind_controller(m);
}
