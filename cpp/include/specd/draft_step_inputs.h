// Draft step inputs: builds the inputs of forward `step` of the draft model's k-step loop from
// forward step - 1's outputs, on the device, so the draft loop never returns to the host
// (DESIGN.md: no host synchronisation in the draft loop). One sequence per row: in forward
// step >= 1 every sequence feeds exactly one token, the one it sampled in the previous forward.
// The CPU reference is draft_step_inputs_cpu; the CUDA kernel (cuda/,
// specd::cuda::draft_step_inputs) follows the same rule in one launch for the whole batch.
//
// Rule, for sequence s in [0, num_seqs):
//   active          = num_steps == nullptr || step < num_steps[s]   (s drafts num_steps[s] tokens)
//   input_ids[s]    = sampled_tokens[s]
//   next            = positions_in[s] + (active ? 1 : 0)
//   positions_out[s] = next
//   slot_mapping[s] = active ? slot of position `next` through block table row s : -1
//                     (kv_layout.h; -1 also when the table does not cover `next`)
//   kv_lens[s]      = next + 1, when kv_lens is given (the KV extent the new token attends)
// An inactive sequence keeps its position and writes no KV (slot -1): its row is padding that
// the caller ignores. positions_in / positions_out may be the same array, and so may
// sampled_tokens / input_ids (each row is read before it is written): the in-place form lets a
// captured CUDA graph replay every step on the same buffers.
#pragma once

#include <cstdint>

#include "specd/host_device.h"
#include "specd/kv_layout.h"
#include "specd/status.h"

namespace specd {

struct DraftStepInputsParams {
  const int32_t* block_table = nullptr;     // [num_seqs, table_stride] page ids (draft model)
  int32_t num_seqs = 0;
  int32_t table_width = 0;    // valid columns of each row (<= table_stride)
  int32_t table_stride = 0;
  int32_t block_size = 0;     // tokens per page of the draft model
  int32_t num_pages = 0;      // pages of the cache: page ids must be in [0, num_pages)
  int32_t step = 1;           // the forward being prepared (>= 1)
  const int32_t* num_steps = nullptr;       // [num_seqs] draft tokens per sequence, or null: all active
  const int64_t* positions_in = nullptr;    // [num_seqs] position fed to forward step - 1
  const int64_t* sampled_tokens = nullptr;  // [num_seqs] token sampled by forward step - 1
  int64_t* positions_out = nullptr;         // [num_seqs] out (may alias positions_in)
  int64_t* input_ids = nullptr;             // [num_seqs] out (may alias sampled_tokens)
  int64_t* slot_mapping = nullptr;          // [num_seqs] out
  int32_t* kv_lens = nullptr;               // [num_seqs] out, optional (null: not written)
};

SPECD_HOST_DEVICE inline bool draft_step_active(const DraftStepInputsParams& p, int32_t s) {
  return p.num_steps == nullptr || p.step < p.num_steps[s];
}

// The rule above for sequence s (reads every input of row s before writing any output).
SPECD_HOST_DEVICE inline void draft_step_inputs_row(const DraftStepInputsParams& p, int32_t s) {
  const bool active = draft_step_active(p, s);
  const int64_t token = p.sampled_tokens[s];
  const int64_t next = p.positions_in[s] + (active ? 1 : 0);
  const int64_t slot =
      active ? paged_kv_slot(p.block_table + int64_t{s} * p.table_stride, p.table_width,
                             p.block_size, p.num_pages, next)
             : -1;
  p.input_ids[s] = token;
  p.positions_out[s] = next;
  p.slot_mapping[s] = slot;
  if (p.kv_lens) p.kv_lens[s] = static_cast<int32_t>(next + 1);
}

// Checks sizes and pointers (not the contents of the arrays).
Status validate_draft_step_inputs(const DraftStepInputsParams& params);

// CPU reference: validates, then applies the rule. strict = true reports (kOutOfRange, before
// writing anything) an active sequence whose next position has no slot.
Status draft_step_inputs_cpu(const DraftStepInputsParams& params, bool strict = false);

}  // namespace specd
