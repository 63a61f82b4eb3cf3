// Paged attention with a token-tree mask, for the verify pass: a few query tokens per request
// (the tree's nodes, or a chain's tokens), each seeing the request's whole committed history
// plus its own ancestors in the tree and itself. A causal chain is the special case of a chain
// tree (or of no mask). The CPU reference is tree_attention_cpu; the CUDA kernel (cuda/,
// specd::cuda::tree_attention) follows the same rule.
//
// The torch path (python/specd/models/attention.py, TorchPagedAttention) stays the default
// until this kernel is measured faster than it on a GPU.
//
// Inputs. Request r owns query tokens [query_start[r], query_start[r + 1]) of the batch (CSR,
// q_len of them) and attends to KV positions [0, kv_lens[r]) of its sequence, read through
// block table row r (kv_layout.h). The last tree_len of those positions are the request's tree
// (tree_len = tree_lens[r] when tree_lens is given, else q_len; q_len <= tree_len <= kv_len):
// its nodes in tree order, already written (kv_write.h), the queries being the last q_len of
// them, so query j is tree node n = tree_len - q_len + j. The first hist = kv_lens[r] - tree_len
// positions are its committed history. tree_lens lets a forward feed only a tree's newest nodes
// while the mask still covers the nodes fed by earlier forwards (a draft tree grown forward by
// forward, engine/draft_tree_graph.py); without it every node is a query (tree_len = q_len).
//
// Visibility of position pos to query j of request r (global token t = query_start[r] + j):
//   pos < hist: visible (the whole history);
//   otherwise m = pos - hist (tree node m) is visible iff
//     tree_mask given: bit m % 64 of word m / 64 of mask row t, i.e.
//                      tree_mask[t * mask_words + m / 64] (TokenTree::ancestor_mask's layout:
//                      a node sees itself and its ancestors);
//     tree_mask null:  m <= n (causal).
// Keys whose position has no slot (kv_layout.h) are skipped (kernel); the CPU reference
// reports them when strict.
//
// Output, per token t and query head h (grouped-query attention: kv head g = h / (q_heads /
// kv_heads) serves query heads [g * group, (g + 1) * group), as HF's repeat_kv):
//   out[t, h] = sum over visible pos of softmax(scale * q[t, h] . k[pos, g]) * v[pos, g]
// A query that sees no key (or a token no request owns) gets zeros.
//
// Not supported (those models keep the torch path): sliding windows, logit soft-capping,
// ALiBi. Precision: the CPU reference reads float32 and accumulates in double; the kernel
// reads fp32/fp16/bf16, accumulates in float (online softmax) and writes the input dtype.
#pragma once

#include <cstdint>

#include "specd/detail/csr_row.h"
#include "specd/host_device.h"
#include "specd/kv_layout.h"
#include "specd/status.h"

namespace specd {

struct TreeAttentionParams {
  const void* q = nullptr;       // [num_tokens, q_heads, head_dim]; token t at q + t * q_token_stride
  int64_t q_token_stride = 0;    // elements between tokens (>= q_heads * head_dim)
  const void* k_cache = nullptr;  // paged [num_pages, block_size, kv_heads, head_dim] (kv_layout.h)
  const void* v_cache = nullptr;
  PagedKvLayout layout;          // head_dim is that of q and out too
  KvDtype dtype = KvDtype::kFloat32;  // of q, the caches and out
  const int32_t* block_table = nullptr;  // [num_seqs, table_stride] page ids
  int32_t table_width = 0;       // valid columns of each row (<= table_stride)
  int32_t table_stride = 0;
  const int32_t* query_start = nullptr;  // [num_seqs + 1] CSR offsets of each request's queries
  const int32_t* kv_lens = nullptr;      // [num_seqs] KV extent (history + new tokens)
  const uint64_t* tree_mask = nullptr;   // [num_tokens, mask_words] or null (causal)
  int32_t mask_words = 0;        // words per mask row (>= ceil(max tree_len / 64) when a mask is given)
  const int32_t* tree_lens = nullptr;    // [num_seqs] each request's tree length, or null (q_len)
  void* out = nullptr;           // [num_tokens, q_heads, head_dim]; token t at out + t * out_token_stride
  int64_t out_token_stride = 0;  // elements between tokens (>= q_heads * head_dim)
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;
  int32_t q_heads = 0;           // a multiple of layout.kv_heads
  float scale = 1.0f;            // usually 1 / sqrt(head_dim)
};

// Where query token t stands: its request (-1: none), its tree node n (the query's index
// among the request's queries plus tree_len - q_len), history length and KV extent.
struct TreeQuery {
  int32_t seq;
  int32_t node;
  int32_t hist;
  int32_t kv_len;
};

SPECD_HOST_DEVICE inline TreeQuery tree_attention_query(const TreeAttentionParams& p, int32_t t) {
  const int32_t r = detail::csr_row_of(p.query_start, p.num_seqs, t);
  if (r < 0) return TreeQuery{-1, 0, 0, 0};
  const int32_t start = p.query_start[r];
  const int32_t q_len = p.query_start[r + 1] - start;
  const int32_t kv_len = p.kv_lens[r];
  const int32_t tree_len = p.tree_lens != nullptr ? p.tree_lens[r] : q_len;
  return TreeQuery{r, tree_len - q_len + (t - start), kv_len - tree_len, kv_len};
}

// The visibility rule above (pos in [0, q.kv_len)).
SPECD_HOST_DEVICE inline bool tree_attention_visible(const TreeAttentionParams& p,
                                                     const TreeQuery& q, int32_t t, int32_t pos) {
  if (pos < q.hist) return true;
  const int64_t m = int64_t{pos} - q.hist;
  if (p.tree_mask == nullptr) return m <= q.node;
  if (m >= int64_t{p.mask_words} * 64) return false;
  const uint64_t word = p.tree_mask[int64_t{t} * p.mask_words + m / 64];
  return ((word >> (m % 64)) & 1u) != 0;
}

// Kv head serving query head h.
SPECD_HOST_DEVICE inline int32_t tree_attention_kv_head(const TreeAttentionParams& p, int32_t h) {
  return h / (p.q_heads / p.layout.kv_heads);
}

// Checks sizes and pointers (not the contents of the arrays).
Status validate_tree_attention(const TreeAttentionParams& params);

// CPU reference (dtype must be kFloat32; host pointers): validates, then computes out by the
// rule above. strict = true first checks the contents (kInvalidArgument / kOutOfRange, naming
// the request): query_start runs from 0 to num_tokens without decreasing, q_len <= tree_len <=
// kv_lens[r], tree_len <= 64 * mask_words when a mask is given, and every position in
// [0, kv_lens[r]) has a slot. Without strict, it does what the kernel does on such input.
Status tree_attention_cpu(const TreeAttentionParams& params, bool strict = false);

}  // namespace specd
