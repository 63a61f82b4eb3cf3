// Python binding of the KV kernels: KV write, accepted-path KV compaction, draft step inputs
// and paged tree attention. CPU references on numpy arrays (float32 caches, modified in place
// where the rule writes the cache) and, when built with CUDA, the kernels on device pointers
// (ints) plus a stream (the torch custom ops pass tensors' data_ptr() and the current stream).
// The rules are in the C++ headers named below; this file only converts and exports.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "cuda_launch.h"
#include "errors.h"
#include "kv_params.h"
#include "numpy_util.h"
#include "specd/draft_step_inputs.h"
#include "specd/kv_compact.h"
#include "specd/kv_layout.h"
#include "specd/kv_write.h"
#include "specd/tree_attention.h"

#ifdef SPECD_WITH_CUDA
#include "specd/cuda/draft_step_inputs.h"
#include "specd/cuda/kv_compact.h"
#include "specd/cuda/kv_write.h"
#include "specd/cuda/runtime.h"
#include "specd/cuda/tree_attention.h"
#include "specd/cuda/tree_attention_grouped.h"
#endif

namespace py = pybind11;


namespace specd::py_bind {
namespace {

template <class T>
using InND = py::array_t<T, py::array::c_style | py::array::forcecast>;

[[noreturn]] void invalid(const std::string& message) {
  raise_status(Status(StatusCode::kInvalidArgument, message));
}

int32_t to_int32(py::ssize_t v, const char* what) {
  if (v < 0 || v > INT32_MAX) invalid(std::string(what) + " = " + std::to_string(v) + " is out of range");
  return static_cast<int32_t>(v);
}

// A float32, C-contiguous, writeable numpy array with ndim in [min_ndim, max_ndim], written in
// place (never a converted copy: that would silently drop the writes).
float* cache_data(py::array& a, const char* name, int min_ndim, int max_ndim) {
  if (!a.dtype().is(py::dtype::of<float>()))
    invalid(std::string(name) + " must be float32, got " + std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style) || !a.writeable())
    invalid(std::string(name) + " must be a C-contiguous, writeable array (it is updated in place)");
  if (a.ndim() < min_ndim || a.ndim() > max_ndim)
    invalid(std::string(name) + " has " + std::to_string(a.ndim()) + " dimensions, expected " +
            std::to_string(min_ndim) + (min_ndim == max_ndim ? "" : " or " + std::to_string(max_ndim)));
  return static_cast<float*>(a.mutable_data());
}

// Layout of a contiguous cache [..., num_pages, block_size, kv_heads, head_dim] (last 4 dims).
PagedKvLayout layout_of(const py::array& cache) {
  const py::ssize_t n = cache.ndim();
  PagedKvLayout l;
  l.num_pages = to_int32(cache.shape(n - 4), "num_pages");
  l.block_size = to_int32(cache.shape(n - 3), "block_size");
  l.kv_heads = to_int32(cache.shape(n - 2), "kv_heads");
  l.head_dim = to_int32(cache.shape(n - 1), "head_dim");
  l.page_stride = int64_t{l.block_size} * l.kv_heads * l.head_dim;
  return l;
}

void same_shape(const py::array& a, const py::array& b, const char* what) {
  bool same = a.ndim() == b.ndim();
  for (py::ssize_t i = 0; same && i < a.ndim(); ++i) same = a.shape(i) == b.shape(i);
  if (!same) invalid(std::string(what) + " must have the same shape");
}

void expect_shape(const py::array& a, const char* name, std::vector<py::ssize_t> shape) {
  bool ok = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (std::size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || a.shape(static_cast<py::ssize_t>(i)) == shape[i];
  if (!ok) {
    std::string want = "[";
    for (std::size_t i = 0; i < shape.size(); ++i)
      want += (i ? ", " : "") + (shape[i] < 0 ? std::string("*") : std::to_string(shape[i]));
    invalid(std::string(name) + " must have shape " + want + "]");
  }
}

void kv_write_cpu_py(py::array k_cache, py::array v_cache, const InND<float>& k, const InND<float>& v,
                     const InND<int64_t>& slot_mapping, bool strict) {
  float* kc = cache_data(k_cache, "k_cache", 4, 4);
  float* vc = cache_data(v_cache, "v_cache", 4, 4);
  same_shape(k_cache, v_cache, "k_cache and v_cache");
  KvWriteParams p;
  p.layout = layout_of(k_cache);
  const py::ssize_t tokens = slot_mapping.ndim() == 1 ? slot_mapping.shape(0) : -1;
  expect_shape(slot_mapping, "slot_mapping", {-1});
  expect_shape(k, "k", {tokens, p.layout.kv_heads, p.layout.head_dim});
  expect_shape(v, "v", {tokens, p.layout.kv_heads, p.layout.head_dim});
  p.k = k.data();
  p.v = v.data();
  p.k_token_stride = p.v_token_stride = kv_row_elems(p.layout);
  p.slot_mapping = slot_mapping.data();
  p.k_cache = kc;
  p.v_cache = vc;
  p.num_tokens = to_int32(tokens, "num_tokens");
  check(kv_write_cpu(p, strict));
}

void kv_compact_cpu_py(py::array k_cache, py::array v_cache, const InND<int32_t>& block_table,
                       const InND<int32_t>& tree_start, const InND<int32_t>& path,
                       const InND<int32_t>& num_accepted, bool strict) {
  float* kc = cache_data(k_cache, "k_cache", 4, 5);
  float* vc = cache_data(v_cache, "v_cache", 4, 5);
  same_shape(k_cache, v_cache, "k_cache and v_cache");
  expect_shape(block_table, "block_table", {-1, -1});
  const py::ssize_t seqs = block_table.shape(0);
  expect_shape(tree_start, "tree_start", {seqs});
  expect_shape(path, "path", {seqs, -1});
  expect_shape(num_accepted, "num_accepted", {seqs});
  KvCompactParams p;
  p.k_cache = kc;
  p.v_cache = vc;
  p.layout = layout_of(k_cache);
  p.num_layers = k_cache.ndim() == 5 ? to_int32(k_cache.shape(0), "num_layers") : 1;
  p.layer_stride = int64_t{p.layout.num_pages} * p.layout.page_stride;
  p.block_table = block_table.data();
  p.num_seqs = to_int32(seqs, "num_seqs");
  p.table_width = p.table_stride = to_int32(block_table.shape(1), "table width");
  p.tree_start = tree_start.data();
  p.path = path.data();
  p.num_accepted = num_accepted.data();
  p.path_stride = to_int32(path.shape(1), "path width");
  if (p.num_layers == 0) return;  // nothing to move
  check(kv_compact_cpu(p, strict));
}

py::tuple draft_step_inputs_cpu_py(const InND<int32_t>& block_table, const InND<int64_t>& positions,
                                   const InND<int64_t>& sampled_tokens, int32_t block_size,
                                   int32_t num_pages, int32_t step,
                                   const std::optional<InND<int32_t>>& num_steps, bool strict) {
  expect_shape(block_table, "block_table", {-1, -1});
  const py::ssize_t seqs = block_table.shape(0);
  expect_shape(positions, "positions", {seqs});
  expect_shape(sampled_tokens, "sampled_tokens", {seqs});
  if (num_steps) expect_shape(*num_steps, "num_steps", {seqs});
  const auto n = static_cast<std::size_t>(seqs);
  std::vector<int64_t> pos_out(n), ids(n), slots(n);
  std::vector<int32_t> kv_lens(n);
  DraftStepInputsParams p;
  p.block_table = block_table.data();
  p.num_seqs = to_int32(seqs, "num_seqs");
  p.table_width = p.table_stride = to_int32(block_table.shape(1), "table width");
  p.block_size = block_size;
  p.num_pages = num_pages;
  p.step = step;
  p.num_steps = num_steps ? num_steps->data() : nullptr;
  p.positions_in = positions.data();
  p.sampled_tokens = sampled_tokens.data();
  p.positions_out = pos_out.data();
  p.input_ids = ids.data();
  p.slot_mapping = slots.data();
  p.kv_lens = kv_lens.data();
  check(draft_step_inputs_cpu(p, strict));
  return py::make_tuple(to_numpy(std::move(pos_out)), to_numpy(std::move(ids)),
                        to_numpy(std::move(slots)), to_numpy(std::move(kv_lens)));
}

py::array_t<float> tree_attention_cpu_py(const InND<float>& q, const InND<float>& k_cache,
                                         const InND<float>& v_cache, const InND<int32_t>& block_table,
                                         const InND<int32_t>& query_start, const InND<int32_t>& kv_lens,
                                         const std::optional<InND<uint64_t>>& tree_mask,
                                         std::optional<double> scale, bool strict,
                                         const std::optional<InND<int32_t>>& tree_lens) {
  expect_shape(k_cache, "k_cache", {-1, -1, -1, -1});
  same_shape(k_cache, v_cache, "k_cache and v_cache");
  TreeAttentionParams p;
  p.layout = layout_of(k_cache);
  expect_shape(q, "q", {-1, -1, p.layout.head_dim});
  expect_shape(block_table, "block_table", {-1, -1});
  const py::ssize_t seqs = block_table.shape(0);
  expect_shape(query_start, "query_start", {seqs + 1});
  expect_shape(kv_lens, "kv_lens", {seqs});
  p.num_tokens = to_int32(q.shape(0), "num_tokens");
  p.q_heads = to_int32(q.shape(1), "q_heads");
  if (tree_mask) {
    expect_shape(*tree_mask, "tree_mask", {q.shape(0), -1});
    p.tree_mask = tree_mask->data();
    p.mask_words = to_int32(tree_mask->shape(1), "mask words");
  }
  if (tree_lens) {
    expect_shape(*tree_lens, "tree_lens", {seqs});
    p.tree_lens = tree_lens->data();
  }
  std::vector<float> out(static_cast<std::size_t>(q.size()));
  p.q = q.data();
  p.q_token_stride = p.out_token_stride = int64_t{p.q_heads} * p.layout.head_dim;
  p.k_cache = k_cache.data();
  p.v_cache = v_cache.data();
  p.block_table = block_table.data();
  p.num_seqs = to_int32(seqs, "num_seqs");
  p.table_width = p.table_stride = to_int32(block_table.shape(1), "table width");
  p.query_start = query_start.data();
  p.kv_lens = kv_lens.data();
  p.out = out.data();
  p.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(p.layout.head_dim)));
  check(tree_attention_cpu(p, strict));
  return to_numpy(std::move(out), {q.shape(0), q.shape(1), q.shape(2)});
}

}  // namespace

void bind_kv_kernels(py::module_& m) {
  py::class_<PagedKvLayout>(m, "PagedKvLayout",
                            "Paged KV cache layout (specd/kv_layout.h): num_pages pages, page_stride "
                            "elements apart, each [block_size, kv_heads, head_dim] contiguous.")
      .def(py::init([](int32_t num_pages, int32_t block_size, int32_t kv_heads, int32_t head_dim,
                       int64_t page_stride) {
             PagedKvLayout l{num_pages, block_size, kv_heads, head_dim, page_stride};
             check(validate_paged_kv_layout(l, "PagedKvLayout"));
             return l;
           }),
           py::arg("num_pages"), py::arg("block_size"), py::arg("kv_heads"), py::arg("head_dim"),
           py::arg("page_stride"))
      .def_readonly("num_pages", &PagedKvLayout::num_pages)
      .def_readonly("block_size", &PagedKvLayout::block_size)
      .def_readonly("kv_heads", &PagedKvLayout::kv_heads)
      .def_readonly("head_dim", &PagedKvLayout::head_dim)
      .def_readonly("page_stride", &PagedKvLayout::page_stride);

  m.def("kv_write_cpu", &kv_write_cpu_py, py::arg("k_cache"), py::arg("v_cache"), py::arg("k"),
        py::arg("v"), py::arg("slot_mapping"), py::arg("strict") = false,
        "CPU reference of the KV write (specd/kv_write.h): stores k, v [num_tokens, kv_heads, "
        "head_dim] at slot_mapping (int64 [num_tokens], -1: skip) into k_cache, v_cache (float32 "
        "[num_pages, block_size, kv_heads, head_dim], updated in place).");
  m.def("kv_compact_cpu", &kv_compact_cpu_py, py::arg("k_cache"), py::arg("v_cache"),
        py::arg("block_table"), py::arg("tree_start"), py::arg("path"), py::arg("num_accepted"),
        py::arg("strict") = false,
        "CPU reference of the accepted-path KV compaction (specd/kv_compact.h). Caches: float32 "
        "[num_pages, block_size, kv_heads, head_dim] or [num_layers, ...], updated in place; "
        "block_table int32 [num_seqs, width]; tree_start int32 [num_seqs]; path int32 [num_seqs, "
        "path_width] (root first); num_accepted int32 [num_seqs].");
  m.def("draft_step_inputs_cpu", &draft_step_inputs_cpu_py, py::arg("block_table"),
        py::arg("positions"), py::arg("sampled_tokens"), py::arg("block_size"), py::arg("num_pages"),
        py::arg("step") = 1, py::arg("num_steps") = py::none(), py::arg("strict") = false,
        "CPU reference of the draft step inputs (specd/draft_step_inputs.h): returns (positions "
        "int64, input_ids int64, slot_mapping int64, kv_lens int32), each [num_seqs].");
  m.def("tree_attention_cpu", &tree_attention_cpu_py, py::arg("q"), py::arg("k_cache"),
        py::arg("v_cache"), py::arg("block_table"), py::arg("query_start"), py::arg("kv_lens"),
        py::arg("tree_mask") = py::none(), py::arg("scale") = py::none(), py::arg("strict") = false,
        py::arg("tree_lens") = py::none(),
        "CPU reference of paged tree attention (specd/tree_attention.h): q float32 [num_tokens, "
        "q_heads, head_dim], caches float32 [num_pages, block_size, kv_heads, head_dim], "
        "block_table int32 [num_seqs, width], query_start int32 [num_seqs + 1], kv_lens int32 "
        "[num_seqs], tree_mask uint64 [num_tokens, mask_words] or None (causal), scale default "
        "1/sqrt(head_dim), tree_lens int32 [num_seqs] or None (each request's tree: its last "
        "tree_lens[r] KV positions, the queries the last of them). Returns float32 [num_tokens, "
        "q_heads, head_dim].");

#ifdef SPECD_WITH_CUDA
  m.def(
      "kv_write_cuda",
      [](uintptr_t k_cache, uintptr_t v_cache, const PagedKvLayout& layout, uintptr_t k,
         uintptr_t v, int64_t k_token_stride, int64_t v_token_stride, uintptr_t slot_mapping,
         int32_t num_tokens, const std::string& dtype, uintptr_t stream) {
        const KvWriteParams p = kv_write_params(k_cache, v_cache, layout, k, v, k_token_stride, v_token_stride,
                                                  slot_mapping, num_tokens, dtype);
        check(validate_kv_write(p));
        check_launch(cuda::kv_write(p, as_stream(stream)), "kv_write");
      },
      py::arg("k_cache_ptr"), py::arg("v_cache_ptr"), py::arg("layout"), py::arg("k_ptr"),
      py::arg("v_ptr"), py::arg("k_token_stride"), py::arg("v_token_stride"),
      py::arg("slot_mapping_ptr"), py::arg("num_tokens"), py::arg("dtype"), py::arg("stream"),
      "Launch the CUDA KV write on device pointers (no host sync). dtype: 'float32', 'float16' "
      "or 'bfloat16' (of k, v and the caches); slot_mapping int64.");
  m.def(
      "kv_compact_cuda",
      [](uintptr_t k_cache, uintptr_t v_cache, const PagedKvLayout& layout, int32_t num_layers,
         int64_t layer_stride, uintptr_t block_table, int32_t num_seqs, int32_t table_width,
         int32_t table_stride, uintptr_t tree_start, uintptr_t path, uintptr_t num_accepted,
         int32_t path_stride, const std::string& dtype, uintptr_t stream) {
        const KvCompactParams p = kv_compact_params(k_cache, v_cache, layout, num_layers, layer_stride, block_table,
                                                      num_seqs, table_width, table_stride, tree_start, path,
                                                      num_accepted, path_stride, dtype);
        check(cuda::validate_kv_compact_launch(p));
        check_launch(cuda::kv_compact(p, as_stream(stream)), "kv_compact");
      },
      py::arg("k_cache_ptr"), py::arg("v_cache_ptr"), py::arg("layout"), py::arg("num_layers"),
      py::arg("layer_stride"), py::arg("block_table_ptr"), py::arg("num_seqs"),
      py::arg("table_width"), py::arg("table_stride"), py::arg("tree_start_ptr"),
      py::arg("path_ptr"), py::arg("num_accepted_ptr"), py::arg("path_stride"), py::arg("dtype"),
      py::arg("stream"),
      "Launch the CUDA accepted-path KV compaction on device pointers (no host sync); int32 "
      "block table, tree_start, path and num_accepted.");
  m.def(
      "draft_step_inputs_cuda",
      [](uintptr_t block_table, int32_t num_seqs, int32_t table_width, int32_t table_stride,
         int32_t block_size, int32_t num_pages, int32_t step, uintptr_t num_steps,
         uintptr_t positions_in, uintptr_t sampled_tokens, uintptr_t positions_out,
         uintptr_t input_ids, uintptr_t slot_mapping, uintptr_t kv_lens, uintptr_t stream) {
        const DraftStepInputsParams p = draft_step_inputs_params(block_table, num_seqs, table_width, table_stride,
                                                                  block_size, num_pages, step, num_steps, positions_in,
                                                                  sampled_tokens, positions_out, input_ids,
                                                                  slot_mapping, kv_lens);
        check(validate_draft_step_inputs(p));
        check_launch(cuda::draft_step_inputs(p, as_stream(stream)), "draft_step_inputs");
      },
      py::arg("block_table_ptr"), py::arg("num_seqs"), py::arg("table_width"),
      py::arg("table_stride"), py::arg("block_size"), py::arg("num_pages"), py::arg("step"),
      py::arg("num_steps_ptr"), py::arg("positions_in_ptr"), py::arg("sampled_tokens_ptr"),
      py::arg("positions_out_ptr"), py::arg("input_ids_ptr"), py::arg("slot_mapping_ptr"),
      py::arg("kv_lens_ptr"), py::arg("stream"),
      "Launch the CUDA draft-step-inputs kernel on device pointers (no host sync). "
      "num_steps_ptr / kv_lens_ptr 0: not used. positions_in may equal positions_out and "
      "sampled_tokens may equal input_ids (in place). int32 table/num_steps/kv_lens, int64 rest.");
  m.def(
      "tree_attention_cuda",
      [](uintptr_t q, int64_t q_token_stride, uintptr_t k_cache, uintptr_t v_cache,
         const PagedKvLayout& layout, uintptr_t block_table, int32_t table_width,
         int32_t table_stride, uintptr_t query_start, uintptr_t kv_lens, uintptr_t tree_mask,
         int32_t mask_words, uintptr_t out, int64_t out_token_stride, int32_t num_seqs,
         int32_t num_tokens, int32_t q_heads, double scale, const std::string& dtype,
         uintptr_t stream, bool grouped, uintptr_t workspace, int64_t workspace_floats, int32_t max_splits,
         uintptr_t tree_lens) {
        const TreeAttentionParams p = tree_attention_params(q, q_token_stride, k_cache, v_cache, layout, block_table,
                                                              table_width, table_stride, query_start, kv_lens,
                                                              tree_mask, mask_words, out, out_token_stride, num_seqs,
                                                              num_tokens, q_heads, scale, dtype, tree_lens);
        if (!grouped) {
          check(cuda::validate_tree_attention_launch(p));
          check_launch(cuda::tree_attention(p, as_stream(stream)), "tree_attention");
          return;
        }
        cuda::TreeAttentionWorkspace ws;
        ws.data = address_ptr<float>(workspace);
        ws.floats = workspace_floats;
        ws.max_splits = max_splits;
        check(cuda::validate_tree_attention_grouped_launch(p, ws));
        check_launch(cuda::tree_attention_grouped(p, ws, as_stream(stream)), "tree_attention_grouped");
      },
      py::arg("q_ptr"), py::arg("q_token_stride"), py::arg("k_cache_ptr"), py::arg("v_cache_ptr"),
      py::arg("layout"), py::arg("block_table_ptr"), py::arg("table_width"),
      py::arg("table_stride"), py::arg("query_start_ptr"), py::arg("kv_lens_ptr"),
      py::arg("tree_mask_ptr"), py::arg("mask_words"), py::arg("out_ptr"),
      py::arg("out_token_stride"), py::arg("num_seqs"), py::arg("num_tokens"), py::arg("q_heads"),
      py::arg("scale"), py::arg("dtype"), py::arg("stream"), py::arg("grouped") = false,
      py::arg("workspace_ptr") = 0, py::arg("workspace_floats") = 0, py::arg("max_splits") = 1,
      py::arg("tree_lens_ptr") = 0,
      "Launch a CUDA paged tree-attention kernel on device pointers (no host sync); tree_mask_ptr "
      "0: causal; tree_lens_ptr 0: every request's tree is its queries (int32 [num_seqs] else). grouped false: one block per token and query head (specd/cuda/tree_attention.h); "
      "true: the split, head-grouped kernel (specd/cuda/tree_attention_grouped.h) with a float32 "
      "workspace of workspace_floats (0 when max_splits is 1) and max_splits.");
  m.def(
      "tree_attention_grouped_plan",
      [](int32_t num_tokens, int32_t q_heads, int32_t kv_heads, int32_t head_dim, int sm_count) {
        const int32_t splits = cuda::tree_attention_grouped_max_splits(
            cuda::tree_attention_grouped_blocks(num_tokens, q_heads, kv_heads), sm_count);
        TreeAttentionParams p;
        p.num_tokens = num_tokens;
        p.q_heads = q_heads;
        p.layout.head_dim = head_dim;
        return py::make_tuple(splits, cuda::tree_attention_grouped_workspace_floats(p, splits));
      },
      py::arg("num_tokens"), py::arg("q_heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("sm_count"),
      "(max_splits, workspace_floats) the grouped kernel takes for this shape on a GPU of sm_count "
      "multiprocessors (tree_attention_grouped_max_splits / _workspace_floats).");
#endif
}

}  // namespace specd::py_bind
