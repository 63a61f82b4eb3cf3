#include "specd/draft_step_inputs.h"

namespace specd {

Status validate_draft_step_inputs(const DraftStepInputsParams& p) {
  SPECD_RETURN_IF_ERROR(validate_block_table(p.block_table, p.num_seqs, p.table_width,
                                             p.table_stride, "draft_step_inputs"));
  if (p.block_size <= 0 || p.num_pages < 0)
    return error_status(StatusCode::kInvalidArgument,
                        "draft_step_inputs: need block_size > 0 and num_pages >= 0, got ",
                        p.block_size, " and ", p.num_pages);
  if (p.step < 1)
    return error_status(StatusCode::kInvalidArgument, "draft_step_inputs: step must be >= 1, got ",
                        p.step);
  if (p.num_seqs > 0 && (!p.positions_in || !p.sampled_tokens || !p.positions_out ||
                         !p.input_ids || !p.slot_mapping))
    return error_status(StatusCode::kInvalidArgument,
                        "draft_step_inputs: null positions, sampled_tokens, input_ids or "
                        "slot_mapping");
  return Status::Ok();
}

Status draft_step_inputs_cpu(const DraftStepInputsParams& p, bool strict) {
  SPECD_RETURN_IF_ERROR(validate_draft_step_inputs(p));
  if (strict) {
    for (int32_t s = 0; s < p.num_seqs; ++s) {
      if (!draft_step_active(p, s)) continue;
      const int64_t next = p.positions_in[s] + 1;
      if (paged_kv_slot(p.block_table + int64_t{s} * p.table_stride, p.table_width, p.block_size,
                        p.num_pages, next) < 0)
        return error_status(StatusCode::kOutOfRange, "draft_step_inputs: sequence ", s,
                            " position ", next, " is not covered by its block table (",
                            p.table_width, " blocks of ", p.block_size, " tokens)");
    }
  }
  for (int32_t s = 0; s < p.num_seqs; ++s) draft_step_inputs_row(p, s);
  return Status::Ok();
}

}  // namespace specd
