// KV compaction after tree verification: moves each request's accepted tree path into the
// positions right after its committed history, so the next step sees one contiguous history.
// The CPU reference is kv_compact_cpu; the CUDA kernel (cuda/, specd::cuda::kv_compact)
// follows the same rule and the same order.
//
// Rule. The verify pass wrote request r's tree node i (node order, root = node 0 first, see
// token_tree.h) at KV position tree_start[r] + i of its sequence. Verification accepted the
// path path[r, 0..n], n = num_accepted[r], root first (verify.h: path[0] == 0; nodes of a
// root-to-node path strictly increase because nodes are in topological order). Then
//   for d = 1, 2, ..., n (in this order): the K and V rows at position tree_start[r] + path[d]
//   are copied to position tree_start[r] + d, in every layer (nothing to do where path[d] == d).
// Positions become slots through block table row r (kv_layout.h).
//
// Why increasing d makes the in-place moves safe: path[0] == 0 and strictly increasing give
// path[d] >= d, so the destination of move d (tree_start + d) is the source of no later move
// d' > d (whose source tree_start + path[d'] has path[d'] >= d' > d). Every source is read before
// anything overwrites it as long as, for each element, a request's moves happen in increasing
// d. The kernel keeps this: one thread owns one element of the row for all d of a request.
// Requests run in parallel, so the rows one request writes must be in pages no other request
// of the call reads or writes (the block manager's copy-on-write guarantees this for the
// lookahead pages a tree is written to), and a block table row must not repeat a page.
//
// Bad input: a request whose path is invalid (n < 0, n >= path_stride, path[0] != 0, or not
// strictly increasing) moves nothing; a move whose source or destination has no slot
// (kv_layout.h) is skipped. The CPU reference reports both as errors when strict.
#pragma once

#include <cstdint>

#include "specd/host_device.h"
#include "specd/kv_layout.h"
#include "specd/status.h"

namespace specd {

struct KvCompactParams {
  void* k_cache = nullptr;   // layer 0's K cache (kv_layout.h)
  void* v_cache = nullptr;   // layer 0's V cache
  PagedKvLayout layout;
  KvDtype dtype = KvDtype::kFloat32;
  int32_t num_layers = 1;    // layers moved by one call
  int64_t layer_stride = 0;  // elements from layer l's K (and V) cache to layer l + 1's
  const int32_t* block_table = nullptr;   // [num_seqs, table_stride] page ids
  int32_t num_seqs = 0;
  int32_t table_width = 0;   // valid columns of each row (<= table_stride)
  int32_t table_stride = 0;
  const int32_t* tree_start = nullptr;    // [num_seqs] KV position of tree node 0 (the root)
  const int32_t* path = nullptr;          // [num_seqs, path_stride] accepted nodes, root first
  const int32_t* num_accepted = nullptr;  // [num_seqs] n: path[r, 0..n] is valid
  int32_t path_stride = 0;   // elements between path rows (max path length incl. the root)
};

// Whether request r's path satisfies the rule's preconditions (see "Bad input").
SPECD_HOST_DEVICE inline bool kv_compact_path_valid(const KvCompactParams& p, int32_t r) {
  const int32_t n = p.num_accepted[r];
  if (n < 0 || n >= p.path_stride) return false;
  const int32_t* path = p.path + int64_t{r} * p.path_stride;
  if (path[0] != 0) return false;
  for (int32_t d = 1; d <= n; ++d)
    if (path[d] <= path[d - 1]) return false;
  return true;
}

struct KvMove {
  int64_t src_slot;  // -1: no slot
  int64_t dst_slot;  // -1: no slot
};

// Slots of move d (1 <= d <= num_accepted[r]) of a request with a valid path.
SPECD_HOST_DEVICE inline KvMove kv_compact_move(const KvCompactParams& p, int32_t r, int32_t d) {
  const int32_t* row = p.block_table + int64_t{r} * p.table_stride;
  const int64_t start = p.tree_start[r];
  const int32_t node = p.path[int64_t{r} * p.path_stride + d];
  const PagedKvLayout& l = p.layout;
  return KvMove{paged_kv_slot(row, p.table_width, l.block_size, l.num_pages, start + node),
                paged_kv_slot(row, p.table_width, l.block_size, l.num_pages, start + d)};
}

// Checks sizes and pointers (not the contents of the arrays).
Status validate_kv_compact(const KvCompactParams& params);

// CPU reference: validates, then moves by the rule above (host pointers, any dtype). strict =
// true reports an invalid path (kInvalidArgument) or a move without a slot (kOutOfRange),
// naming the request, before moving anything.
Status kv_compact_cpu(const KvCompactParams& params, bool strict = false);

}  // namespace specd
