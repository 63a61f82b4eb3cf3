// Slot mapping: the KV-cache slot each token of a forward pass writes, computed from padded
// block tables (see BlockManager::export_padded) and per-token positions. This is what the
// engine (and later the on-device draft loop) uses to turn (sequence, position) into the slot
// its K/V goes to; the CUDA kernel (cuda/, specd::cuda::slot_mapping) follows the same rule.
//
// Rule, for token t (all ranges half-open):
//   s = seq_index[t], p = positions[t], b = p / block_size
//   slot[t] = block_table[s * table_stride + b] * block_size + p % block_size
//   slot[t] = -1 (write nothing) when s < 0 (a padding token), s >= num_seqs, p < 0,
//             b >= table_width, or the table entry is negative.
// Padding tokens get -1 by design; the other -1 cases mean the caller's tables do not cover
// the position and are reported by slot_mapping_cpu's validation only when asked to be strict.
#pragma once

#include <cstdint>

#include "specd/host_device.h"
#include "specd/status.h"

namespace specd {

struct SlotMappingParams {
  const int32_t* block_table = nullptr;  // [num_seqs, table_stride] page ids, row-major
  const int32_t* seq_index = nullptr;    // [num_tokens] row of block_table; < 0 marks padding
  const int32_t* positions = nullptr;    // [num_tokens] token position within its sequence
  int64_t* slots = nullptr;              // [num_tokens] out
  int32_t num_seqs = 0;
  int32_t table_width = 0;   // valid columns of each row (<= table_stride)
  int32_t table_stride = 0;  // elements between rows
  int32_t num_tokens = 0;
  int32_t block_size = 0;    // tokens per block of the model the slots are for
};

SPECD_HOST_DEVICE inline int64_t slot_of_token(const SlotMappingParams& p, int32_t t) {
  const int32_t s = p.seq_index[t];
  const int32_t pos = p.positions[t];
  if (s < 0 || s >= p.num_seqs || pos < 0) return -1;
  const int32_t block = pos / p.block_size;
  if (block >= p.table_width) return -1;
  const int32_t page = p.block_table[int64_t{s} * p.table_stride + block];
  if (page < 0) return -1;
  return int64_t{page} * p.block_size + pos % p.block_size;
}

// Checks sizes and pointers (not the contents of the arrays).
Status validate_slot_mapping(const SlotMappingParams& params);

// CPU reference: validates, then fills params.slots by the rule above. With strict = true, a
// non-padding token whose slot would be -1 is an error naming the token (the check the
// Python layer uses on host inputs); the CUDA kernel cannot report per-token errors and
// always writes -1 instead.
Status slot_mapping_cpu(const SlotMappingParams& params, bool strict = false);

}  // namespace specd
