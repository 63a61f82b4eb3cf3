// Python binding of the KV slot-mapping rule: CPU reference on numpy arrays and, when built
// with CUDA, the kernel on device pointers (the Python layer passes torch tensors' pointers).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "errors.h"
#include "numpy_util.h"
#include "specd/kv_slot_mapping.h"

#ifdef SPECD_WITH_CUDA
#include "specd/cuda/kv_slot_mapping.h"
#include "specd/cuda/runtime.h"
#endif

namespace py = pybind11;

namespace specd::py_bind {
namespace {

int32_t checked_int32(py::ssize_t v, const char* what) {
  if (v < 0 || v > INT32_MAX)
    raise_status(error_status(StatusCode::kInvalidArgument, what, " = ", v, " is out of range"));
  return static_cast<int32_t>(v);
}

py::array_t<int64_t> slot_mapping_cpu_py(const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& table,
                                         const InArray<int32_t>& seq_index,
                                         const InArray<int32_t>& positions, int32_t block_size,
                                         bool strict) {
  if (table.ndim() != 2)
    raise_status(error_status(StatusCode::kInvalidArgument,
                              "block_table must be 2-D [num_seqs, width], got ", table.ndim(),
                              " dimensions"));
  Span<const int32_t> seqs = as_span(seq_index, "seq_index");
  Span<const int32_t> pos = as_span(positions, "positions");
  if (seqs.size() != pos.size())
    raise_status(error_status(StatusCode::kInvalidArgument, "seq_index has ", seqs.size(),
                              " tokens but positions has ", pos.size()));
  std::vector<int64_t> slots(seqs.size());
  SlotMappingParams p;
  p.block_table = table.data();
  p.seq_index = seqs.data();
  p.positions = pos.data();
  p.slots = slots.data();
  p.num_seqs = checked_int32(table.shape(0), "num_seqs");
  p.table_width = checked_int32(table.shape(1), "table width");
  p.table_stride = p.table_width;
  p.num_tokens = checked_int32(static_cast<py::ssize_t>(seqs.size()), "num_tokens");
  p.block_size = block_size;
  check(slot_mapping_cpu(p, strict));
  return to_numpy(std::move(slots));
}

}  // namespace

void bind_kv(py::module_& m) {
  m.def("slot_mapping_cpu", &slot_mapping_cpu_py, py::arg("block_table"), py::arg("seq_index"),
        py::arg("positions"), py::arg("block_size"), py::arg("strict") = false,
        "CPU reference of the slot-mapping rule (specd/kv_slot_mapping.h): int64 [num_tokens].");
#ifdef SPECD_WITH_CUDA
  m.def(
      "slot_mapping_cuda",
      [](uintptr_t table, int32_t num_seqs, int32_t width, int32_t stride, uintptr_t seq_index,
         uintptr_t positions, uintptr_t slots, int32_t num_tokens, int32_t block_size,
         uintptr_t stream) {
        SlotMappingParams p;
        p.block_table = reinterpret_cast<const int32_t*>(table);
        p.seq_index = reinterpret_cast<const int32_t*>(seq_index);
        p.positions = reinterpret_cast<const int32_t*>(positions);
        p.slots = reinterpret_cast<int64_t*>(slots);
        p.num_seqs = num_seqs;
        p.table_width = width;
        p.table_stride = stride;
        p.num_tokens = num_tokens;
        p.block_size = block_size;
        check(validate_slot_mapping(p));
        const cudaError_t err = cuda::slot_mapping(p, reinterpret_cast<cudaStream_t>(stream));
        if (err != cudaSuccess)
          raise_status(error_status(StatusCode::kInternal, "slot_mapping kernel launch failed: ",
                                    cuda::error_string(err)));
      },
      py::arg("block_table_ptr"), py::arg("num_seqs"), py::arg("table_width"),
      py::arg("table_stride"), py::arg("seq_index_ptr"), py::arg("positions_ptr"),
      py::arg("slots_ptr"), py::arg("num_tokens"), py::arg("block_size"), py::arg("stream"),
      "Launch the CUDA slot-mapping kernel on device pointers (no host sync).");
#endif
}

}  // namespace specd::py_bind
