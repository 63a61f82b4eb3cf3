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
#include "kv_params.h"
#include "specd/draft_step_inputs.h"
#include "specd/kv_compact.h"
#include "specd/kv_layout.h"
#include "specd/kv_write.h"
#include "specd/tree_attention.h"

namespace py = pybind11;

namespace specd::py_bind {
namespace {

void kv_write_ptr(uintptr_t k_cache, uintptr_t v_cache, const PagedKvLayout& layout, uintptr_t k,
                  uintptr_t v, int64_t k_token_stride, int64_t v_token_stride,
                  uintptr_t slot_mapping, int32_t num_tokens, const std::string& dtype) {
  check(kv_write_cpu(kv_write_params(k_cache, v_cache, layout, k, v, k_token_stride, v_token_stride, slot_mapping,
                                     num_tokens, dtype),
                     /*strict=*/false));
}

void kv_compact_ptr(uintptr_t k_cache, uintptr_t v_cache, const PagedKvLayout& layout,
                    int32_t num_layers, int64_t layer_stride, uintptr_t block_table,
                    int32_t num_seqs, int32_t table_width, int32_t table_stride,
                    uintptr_t tree_start, uintptr_t path, uintptr_t num_accepted,
                    int32_t path_stride, const std::string& dtype) {
  if (num_layers == 0 || num_seqs == 0) return;  // nothing to move
  check(kv_compact_cpu(kv_compact_params(k_cache, v_cache, layout, num_layers, layer_stride, block_table, num_seqs,
                                         table_width, table_stride, tree_start, path, num_accepted, path_stride,
                                         dtype),
                       /*strict=*/false));
}

void draft_step_inputs_ptr(uintptr_t block_table, int32_t num_seqs, int32_t table_width,
                           int32_t table_stride, int32_t block_size, int32_t num_pages,
                           int32_t step, uintptr_t num_steps, uintptr_t positions_in,
                           uintptr_t sampled_tokens, uintptr_t positions_out, uintptr_t input_ids,
                           uintptr_t slot_mapping, uintptr_t kv_lens) {
  check(draft_step_inputs_cpu(draft_step_inputs_params(block_table, num_seqs, table_width, table_stride, block_size,
                                                       num_pages, step, num_steps, positions_in, sampled_tokens,
                                                       positions_out, input_ids, slot_mapping, kv_lens),
                              /*strict=*/false));
}

void tree_attention_ptr(uintptr_t q, int64_t q_token_stride, uintptr_t k_cache, uintptr_t v_cache,
                        const PagedKvLayout& layout, uintptr_t block_table, int32_t table_width,
                        int32_t table_stride, uintptr_t query_start, uintptr_t kv_lens,
                        uintptr_t tree_mask, int32_t mask_words, uintptr_t out,
                        int64_t out_token_stride, int32_t num_seqs, int32_t num_tokens,
                        int32_t q_heads, double scale, const std::string& dtype, uintptr_t tree_lens) {
  check(tree_attention_cpu(tree_attention_params(q, q_token_stride, k_cache, v_cache, layout, block_table, table_width,
                                                 table_stride, query_start, kv_lens, tree_mask, mask_words, out,
                                                 out_token_stride, num_seqs, num_tokens, q_heads, scale, dtype,
                                                 tree_lens),
                           /*strict=*/false));
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
        py::arg("dtype"), py::arg("tree_lens_ptr") = 0,
        "tree_attention_cpu (specd/tree_attention.h) on host pointers: the arguments of "
        "tree_attention_cuda without the stream; dtype must be 'float32' (the reference's).");
}

}  // namespace specd::py_bind
