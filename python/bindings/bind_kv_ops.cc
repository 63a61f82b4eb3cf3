// Host-pointer entry points of the KV kernels' CPU references, for the torch custom ops
// (python/specd/ops). They take exactly the arguments of the *_cuda launchers of
// bind_kv_kernels.cc, minus the stream, so one argument builder in Python serves both
// devices. Pointers are host addresses (a CPU tensor's data_ptr()) of memory the caller owns
// and sized as the rule header says; unlike the numpy entry points (kv_write_cpu, ...), these
// take any KV dtype and the strided per-layer views of the page pool, so caches are updated
// in place, never through a converted copy. The rules are in the headers named below.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "errors.h"
#include "specd/draft_step_inputs.h"
#include "specd/kv_compact.h"
#include "specd/kv_layout.h"
#include "specd/kv_write.h"
#include "specd/tree_attention.h"

namespace py = pybind11;

namespace specd::py_bind {
namespace {

template <class T>
T* host_ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

KvDtype kv_dtype(const std::string& name) {
  KvDtype d = KvDtype::kFloat32;
  check(parse_kv_dtype(name.c_str(), &d));
  return d;
}

void kv_write_ptr(uintptr_t k_cache, uintptr_t v_cache, const PagedKvLayout& layout, uintptr_t k,
                  uintptr_t v, int64_t k_token_stride, int64_t v_token_stride,
                  uintptr_t slot_mapping, int32_t num_tokens, const std::string& dtype) {
  KvWriteParams p;
  p.k = host_ptr<const void>(k);
  p.v = host_ptr<const void>(v);
  p.k_token_stride = k_token_stride;
  p.v_token_stride = v_token_stride;
  p.slot_mapping = host_ptr<const int64_t>(slot_mapping);
  p.k_cache = host_ptr<void>(k_cache);
  p.v_cache = host_ptr<void>(v_cache);
  p.layout = layout;
  p.dtype = kv_dtype(dtype);
  p.num_tokens = num_tokens;
  check(kv_write_cpu(p, /*strict=*/false));
}

void kv_compact_ptr(uintptr_t k_cache, uintptr_t v_cache, const PagedKvLayout& layout,
                    int32_t num_layers, int64_t layer_stride, uintptr_t block_table,
                    int32_t num_seqs, int32_t table_width, int32_t table_stride,
                    uintptr_t tree_start, uintptr_t path, uintptr_t num_accepted,
                    int32_t path_stride, const std::string& dtype) {
  KvCompactParams p;
  p.k_cache = host_ptr<void>(k_cache);
  p.v_cache = host_ptr<void>(v_cache);
  p.layout = layout;
  p.dtype = kv_dtype(dtype);
  p.num_layers = num_layers;
  p.layer_stride = layer_stride;
  p.block_table = host_ptr<const int32_t>(block_table);
  p.num_seqs = num_seqs;
  p.table_width = table_width;
  p.table_stride = table_stride;
  p.tree_start = host_ptr<const int32_t>(tree_start);
  p.path = host_ptr<const int32_t>(path);
  p.num_accepted = host_ptr<const int32_t>(num_accepted);
  p.path_stride = path_stride;
  if (num_layers == 0 || num_seqs == 0) return;  // nothing to move
  check(kv_compact_cpu(p, /*strict=*/false));
}

void draft_step_inputs_ptr(uintptr_t block_table, int32_t num_seqs, int32_t table_width,
                           int32_t table_stride, int32_t block_size, int32_t num_pages,
                           int32_t step, uintptr_t num_steps, uintptr_t positions_in,
                           uintptr_t sampled_tokens, uintptr_t positions_out, uintptr_t input_ids,
                           uintptr_t slot_mapping, uintptr_t kv_lens) {
  DraftStepInputsParams p;
  p.block_table = host_ptr<const int32_t>(block_table);
  p.num_seqs = num_seqs;
  p.table_width = table_width;
  p.table_stride = table_stride;
  p.block_size = block_size;
  p.num_pages = num_pages;
  p.step = step;
  p.num_steps = host_ptr<const int32_t>(num_steps);
  p.positions_in = host_ptr<const int64_t>(positions_in);
  p.sampled_tokens = host_ptr<const int64_t>(sampled_tokens);
  p.positions_out = host_ptr<int64_t>(positions_out);
  p.input_ids = host_ptr<int64_t>(input_ids);
  p.slot_mapping = host_ptr<int64_t>(slot_mapping);
  p.kv_lens = host_ptr<int32_t>(kv_lens);
  check(draft_step_inputs_cpu(p, /*strict=*/false));
}

void tree_attention_ptr(uintptr_t q, int64_t q_token_stride, uintptr_t k_cache, uintptr_t v_cache,
                        const PagedKvLayout& layout, uintptr_t block_table, int32_t table_width,
                        int32_t table_stride, uintptr_t query_start, uintptr_t kv_lens,
                        uintptr_t tree_mask, int32_t mask_words, uintptr_t out,
                        int64_t out_token_stride, int32_t num_seqs, int32_t num_tokens,
                        int32_t q_heads, double scale, const std::string& dtype) {
  TreeAttentionParams p;
  p.q = host_ptr<const void>(q);
  p.q_token_stride = q_token_stride;
  p.k_cache = host_ptr<const void>(k_cache);
  p.v_cache = host_ptr<const void>(v_cache);
  p.layout = layout;
  p.dtype = kv_dtype(dtype);
  p.block_table = host_ptr<const int32_t>(block_table);
  p.table_width = table_width;
  p.table_stride = table_stride;
  p.query_start = host_ptr<const int32_t>(query_start);
  p.kv_lens = host_ptr<const int32_t>(kv_lens);
  p.tree_mask = host_ptr<const uint64_t>(tree_mask);
  p.mask_words = mask_words;
  p.out = host_ptr<void>(out);
  p.out_token_stride = out_token_stride;
  p.num_seqs = num_seqs;
  p.num_tokens = num_tokens;
  p.q_heads = q_heads;
  p.scale = static_cast<float>(scale);
  check(tree_attention_cpu(p, /*strict=*/false));
}

}  // namespace

void bind_kv_ops(py::module_& m) {
  m.def("kv_write_cpu_ptr", &kv_write_ptr, py::arg("k_cache_ptr"), py::arg("v_cache_ptr"),
        py::arg("layout"), py::arg("k_ptr"), py::arg("v_ptr"), py::arg("k_token_stride"),
        py::arg("v_token_stride"), py::arg("slot_mapping_ptr"), py::arg("num_tokens"),
        py::arg("dtype"),
        "kv_write_cpu (specd/kv_write.h) on host pointers: the arguments of kv_write_cuda "
        "without the stream; any KV dtype, caches page_stride apart, written in place.");
  m.def("kv_compact_cpu_ptr", &kv_compact_ptr, py::arg("k_cache_ptr"), py::arg("v_cache_ptr"),
        py::arg("layout"), py::arg("num_layers"), py::arg("layer_stride"),
        py::arg("block_table_ptr"), py::arg("num_seqs"), py::arg("table_width"),
        py::arg("table_stride"), py::arg("tree_start_ptr"), py::arg("path_ptr"),
        py::arg("num_accepted_ptr"), py::arg("path_stride"), py::arg("dtype"),
        "kv_compact_cpu (specd/kv_compact.h) on host pointers: the arguments of kv_compact_cuda "
        "without the stream.");
  m.def("draft_step_inputs_cpu_ptr", &draft_step_inputs_ptr, py::arg("block_table_ptr"),
        py::arg("num_seqs"), py::arg("table_width"), py::arg("table_stride"),
        py::arg("block_size"), py::arg("num_pages"), py::arg("step"), py::arg("num_steps_ptr"),
        py::arg("positions_in_ptr"), py::arg("sampled_tokens_ptr"), py::arg("positions_out_ptr"),
        py::arg("input_ids_ptr"), py::arg("slot_mapping_ptr"), py::arg("kv_lens_ptr"),
        "draft_step_inputs_cpu (specd/draft_step_inputs.h) on host pointers: the arguments of "
        "draft_step_inputs_cuda without the stream (in place allowed, as there).");
  m.def("tree_attention_cpu_ptr", &tree_attention_ptr, py::arg("q_ptr"), py::arg("q_token_stride"),
        py::arg("k_cache_ptr"), py::arg("v_cache_ptr"), py::arg("layout"),
        py::arg("block_table_ptr"), py::arg("table_width"), py::arg("table_stride"),
        py::arg("query_start_ptr"), py::arg("kv_lens_ptr"), py::arg("tree_mask_ptr"),
        py::arg("mask_words"), py::arg("out_ptr"), py::arg("out_token_stride"),
        py::arg("num_seqs"), py::arg("num_tokens"), py::arg("q_heads"), py::arg("scale"),
        py::arg("dtype"),
        "tree_attention_cpu (specd/tree_attention.h) on host pointers: the arguments of "
        "tree_attention_cuda without the stream; dtype must be 'float32' (the reference's).");
}

}  // namespace specd::py_bind
