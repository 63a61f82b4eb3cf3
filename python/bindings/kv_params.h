// The KV kernels' parameter structs built from raw addresses (integers from Python: a CPU
// tensor's or a CUDA tensor's data_ptr()), shared by the host-pointer entry points of the CPU
// references (bind_kv_ops.cc) and the CUDA launchers (bind_kv_kernels.cc), which take the
// same arguments (plus a stream for CUDA). The rules are in the headers included below.
#pragma once

#include <cstdint>
#include <string>

#include "errors.h"
#include "specd/draft_step_inputs.h"
#include "specd/kv_compact.h"
#include "specd/kv_layout.h"
#include "specd/kv_write.h"
#include "specd/tree_attention.h"

namespace specd::py_bind {

template <class T>
inline T* address_ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

inline KvDtype kv_dtype(const std::string& name) {
  KvDtype d = KvDtype::kFloat32;
  check(parse_kv_dtype(name.c_str(), &d));
  return d;
}

inline KvWriteParams kv_write_params(uintptr_t k_cache, uintptr_t v_cache, const PagedKvLayout& layout, uintptr_t k,
                                     uintptr_t v, int64_t k_token_stride, int64_t v_token_stride,
                                     uintptr_t slot_mapping, int32_t num_tokens, const std::string& dtype) {
  KvWriteParams p;
  p.k = address_ptr<const void>(k);
  p.v = address_ptr<const void>(v);
  p.k_token_stride = k_token_stride;
  p.v_token_stride = v_token_stride;
  p.slot_mapping = address_ptr<const int64_t>(slot_mapping);
  p.k_cache = address_ptr<void>(k_cache);
  p.v_cache = address_ptr<void>(v_cache);
  p.layout = layout;
  p.dtype = kv_dtype(dtype);
  p.num_tokens = num_tokens;
  return p;
}

inline KvCompactParams kv_compact_params(uintptr_t k_cache, uintptr_t v_cache, const PagedKvLayout& layout,
                                         int32_t num_layers, int64_t layer_stride, uintptr_t block_table,
                                         int32_t num_seqs, int32_t table_width, int32_t table_stride,
                                         uintptr_t tree_start, uintptr_t path, uintptr_t num_accepted,
                                         int32_t path_stride, const std::string& dtype) {
  KvCompactParams p;
  p.k_cache = address_ptr<void>(k_cache);
  p.v_cache = address_ptr<void>(v_cache);
  p.layout = layout;
  p.dtype = kv_dtype(dtype);
  p.num_layers = num_layers;
  p.layer_stride = layer_stride;
  p.block_table = address_ptr<const int32_t>(block_table);
  p.num_seqs = num_seqs;
  p.table_width = table_width;
  p.table_stride = table_stride;
  p.tree_start = address_ptr<const int32_t>(tree_start);
  p.path = address_ptr<const int32_t>(path);
  p.num_accepted = address_ptr<const int32_t>(num_accepted);
  p.path_stride = path_stride;
  return p;
}

inline DraftStepInputsParams draft_step_inputs_params(uintptr_t block_table, int32_t num_seqs, int32_t table_width,
                                                      int32_t table_stride, int32_t block_size, int32_t num_pages,
                                                      int32_t step, uintptr_t num_steps, uintptr_t positions_in,
                                                      uintptr_t sampled_tokens, uintptr_t positions_out, uintptr_t input_ids,
                                                      uintptr_t slot_mapping, uintptr_t kv_lens) {
  DraftStepInputsParams p;
  p.block_table = address_ptr<const int32_t>(block_table);
  p.num_seqs = num_seqs;
  p.table_width = table_width;
  p.table_stride = table_stride;
  p.block_size = block_size;
  p.num_pages = num_pages;
  p.step = step;
  p.num_steps = address_ptr<const int32_t>(num_steps);
  p.positions_in = address_ptr<const int64_t>(positions_in);
  p.sampled_tokens = address_ptr<const int64_t>(sampled_tokens);
  p.positions_out = address_ptr<int64_t>(positions_out);
  p.input_ids = address_ptr<int64_t>(input_ids);
  p.slot_mapping = address_ptr<int64_t>(slot_mapping);
  p.kv_lens = address_ptr<int32_t>(kv_lens);
  return p;
}

inline TreeAttentionParams tree_attention_params(uintptr_t q, int64_t q_token_stride, uintptr_t k_cache, uintptr_t v_cache,
                                                 const PagedKvLayout& layout, uintptr_t block_table, int32_t table_width,
                                                 int32_t table_stride, uintptr_t query_start, uintptr_t kv_lens,
                                                 uintptr_t tree_mask, int32_t mask_words, uintptr_t out,
                                                 int64_t out_token_stride, int32_t num_seqs, int32_t num_tokens,
                                                 int32_t q_heads, double scale, const std::string& dtype,
                                                 uintptr_t tree_lens = 0) {
  TreeAttentionParams p;
  p.q = address_ptr<const void>(q);
  p.q_token_stride = q_token_stride;
  p.k_cache = address_ptr<const void>(k_cache);
  p.v_cache = address_ptr<const void>(v_cache);
  p.layout = layout;
  p.dtype = kv_dtype(dtype);
  p.block_table = address_ptr<const int32_t>(block_table);
  p.table_width = table_width;
  p.table_stride = table_stride;
  p.query_start = address_ptr<const int32_t>(query_start);
  p.kv_lens = address_ptr<const int32_t>(kv_lens);
  p.tree_mask = address_ptr<const uint64_t>(tree_mask);
  p.mask_words = mask_words;
  p.tree_lens = address_ptr<const int32_t>(tree_lens);
  p.out = address_ptr<void>(out);
  p.out_token_stride = out_token_stride;
  p.num_seqs = num_seqs;
  p.num_tokens = num_tokens;
  p.q_heads = q_heads;
  p.scale = static_cast<float>(scale);
  return p;
}

}  // namespace specd::py_bind
