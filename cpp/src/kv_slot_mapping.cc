#include "specd/kv_slot_mapping.h"

namespace specd {

Status validate_slot_mapping(const SlotMappingParams& p) {
  if (p.block_size <= 0)
    return error_status(StatusCode::kInvalidArgument, "block_size must be > 0, got ", p.block_size);
  if (p.num_tokens < 0 || p.num_seqs < 0 || p.table_width < 0)
    return error_status(StatusCode::kInvalidArgument,
                        "num_tokens, num_seqs and table_width must be >= 0");
  if (p.table_stride < p.table_width)
    return error_status(StatusCode::kInvalidArgument, "table_stride ", p.table_stride,
                        " is smaller than table_width ", p.table_width);
  if (p.num_tokens > 0 && (!p.seq_index || !p.positions || !p.slots))
    return error_status(StatusCode::kInvalidArgument, "null seq_index, positions or slots");
  if (p.num_seqs > 0 && p.table_width > 0 && !p.block_table)
    return error_status(StatusCode::kInvalidArgument, "null block_table");
  return Status::Ok();
}

Status slot_mapping_cpu(const SlotMappingParams& p, bool strict) {
  SPECD_RETURN_IF_ERROR(validate_slot_mapping(p));
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    p.slots[t] = slot_of_token(p, t);
    if (strict && p.slots[t] < 0 && p.seq_index[t] >= 0)
      return error_status(StatusCode::kOutOfRange, "token ", t, " (sequence row ",
                          p.seq_index[t], ", position ", p.positions[t],
                          ") is not covered by the block table (", p.num_seqs, " rows x ",
                          p.table_width, " blocks of ", p.block_size, " tokens)");
  }
  return Status::Ok();
}

}  // namespace specd
