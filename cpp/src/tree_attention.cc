#include "specd/tree_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace specd {

Status validate_tree_attention(const TreeAttentionParams& p) {
  SPECD_RETURN_IF_ERROR(validate_paged_kv_layout(p.layout, "tree_attention"));
  SPECD_RETURN_IF_ERROR(validate_kv_dtype(p.dtype, "tree_attention"));
  SPECD_RETURN_IF_ERROR(validate_block_table(p.block_table, p.num_seqs, p.table_width,
                                             p.table_stride, "tree_attention"));
  if (p.num_tokens < 0)
    return error_status(StatusCode::kInvalidArgument,
                        "tree_attention: num_tokens must be >= 0, got ", p.num_tokens);
  if (p.q_heads <= 0 || p.q_heads % p.layout.kv_heads != 0)
    return error_status(StatusCode::kInvalidArgument, "tree_attention: q_heads (", p.q_heads,
                        ") must be a positive multiple of kv_heads (", p.layout.kv_heads, ")");
  const int64_t row = int64_t{p.q_heads} * p.layout.head_dim;
  if (p.q_token_stride < row || p.out_token_stride < row)
    return error_status(StatusCode::kInvalidArgument, "tree_attention: token strides ",
                        p.q_token_stride, " (q) and ", p.out_token_stride,
                        " (out) must be >= q_heads * head_dim = ", row);
  if (!std::isfinite(p.scale))
    return error_status(StatusCode::kInvalidArgument, "tree_attention: scale must be finite");
  if (p.tree_mask && (p.mask_words < 1 || p.mask_words > (1 << 24)))
    return error_status(StatusCode::kInvalidArgument,
                        "tree_attention: mask_words must be in [1, 2^24] with a mask, got ",
                        p.mask_words);
  if (!p.query_start)
    return error_status(StatusCode::kInvalidArgument, "tree_attention: null query_start");
  if (p.num_seqs > 0 && !p.kv_lens)
    return error_status(StatusCode::kInvalidArgument, "tree_attention: null kv_lens");
  if (p.num_tokens > 0 && (!p.q || !p.out))
    return error_status(StatusCode::kInvalidArgument, "tree_attention: null q or out");
  if (p.num_tokens > 0 && p.layout.num_pages > 0 && (!p.k_cache || !p.v_cache))
    return error_status(StatusCode::kInvalidArgument, "tree_attention: null k_cache or v_cache");
  return Status::Ok();
}

namespace {

Status check_contents(const TreeAttentionParams& p) {
  if (p.query_start[0] != 0 || p.query_start[p.num_seqs] != p.num_tokens)
    return error_status(StatusCode::kInvalidArgument, "tree_attention: query_start must run from 0 to num_tokens (",
                        p.num_tokens, "), got ", p.query_start[0], " .. ", p.query_start[p.num_seqs]);
  for (int32_t r = 0; r < p.num_seqs; ++r) {
    const int32_t q_len = p.query_start[r + 1] - p.query_start[r];
    if (q_len < 0)
      return error_status(StatusCode::kInvalidArgument, "tree_attention: query_start decreases at request ", r);
    const int32_t tree_len = p.tree_lens ? p.tree_lens[r] : q_len;
    if (tree_len < q_len)
      return error_status(StatusCode::kInvalidArgument, "tree_attention: request ", r, " has tree_len ",
                          tree_len, " < its ", q_len, " queries");
    if (p.kv_lens[r] < tree_len)
      return error_status(StatusCode::kInvalidArgument, "tree_attention: request ", r, " has kv_len ",
                          p.kv_lens[r], " < its ", tree_len, p.tree_lens ? " tree nodes" : " queries");
    if (p.tree_mask && int64_t{tree_len} > int64_t{p.mask_words} * 64)
      return error_status(StatusCode::kInvalidArgument, "tree_attention: request ", r, " has ", tree_len,
                          p.tree_lens ? " tree nodes" : " queries", " but mask rows of ", p.mask_words, " words");
    const int32_t* row = p.block_table + int64_t{r} * p.table_stride;
    for (int32_t pos = 0; pos < p.kv_lens[r]; ++pos)
      if (paged_kv_slot(row, p.table_width, p.layout.block_size, p.layout.num_pages, pos) < 0)
        return error_status(StatusCode::kOutOfRange, "tree_attention: request ", r, " position ", pos,
                            " (kv_len ", p.kv_lens[r], ") is not covered by its block table");
  }
  return Status::Ok();
}

}  // namespace

Status tree_attention_cpu(const TreeAttentionParams& p, bool strict) {
  SPECD_RETURN_IF_ERROR(validate_tree_attention(p));
  SPECD_RETURN_IF_ERROR(require_cpu_float32(p.dtype, "tree_attention_cpu"));
  if (strict) SPECD_RETURN_IF_ERROR(check_contents(p));
  const int32_t dim = p.layout.head_dim;
  const auto* q = static_cast<const float*>(p.q);
  const auto* k_cache = static_cast<const float*>(p.k_cache);
  const auto* v_cache = static_cast<const float*>(p.v_cache);
  auto* out = static_cast<float*>(p.out);
  std::vector<double> scores, acc(static_cast<std::size_t>(dim));
  std::vector<int64_t> rows;  // element offsets of the visible keys' rows (kv head applied)
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const TreeQuery tq = tree_attention_query(p, t);
    for (int32_t h = 0; h < p.q_heads; ++h) {
      const float* qh = q + t * p.q_token_stride + int64_t{h} * dim;
      float* oh = out + t * p.out_token_stride + int64_t{h} * dim;
      scores.clear();
      rows.clear();
      if (tq.seq >= 0) {
        const int32_t* row = p.block_table + int64_t{tq.seq} * p.table_stride;
        const int64_t head = int64_t{tree_attention_kv_head(p, h)} * dim;
        for (int32_t pos = 0; pos < tq.kv_len; ++pos) {
          if (!tree_attention_visible(p, tq, t, pos)) continue;
          const int64_t slot =
              paged_kv_slot(row, p.table_width, p.layout.block_size, p.layout.num_pages, pos);
          if (slot < 0) continue;
          const int64_t off = kv_row_offset(p.layout, slot) + head;
          double dot = 0;
          for (int32_t d = 0; d < dim; ++d) dot += double{qh[d]} * double{k_cache[off + d]};
          scores.push_back(dot * double{p.scale});
          rows.push_back(off);
        }
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      if (!scores.empty()) {
        const double max = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (std::size_t i = 0; i < scores.size(); ++i) {
          const double w = std::exp(scores[i] - max);
          sum += w;
          for (int32_t d = 0; d < dim; ++d) acc[static_cast<std::size_t>(d)] += w * double{v_cache[rows[i] + d]};
        }
        for (double& a : acc) a /= sum;
      }
      for (int32_t d = 0; d < dim; ++d) oh[d] = static_cast<float>(acc[static_cast<std::size_t>(d)]);
    }
  }
  return Status::Ok();
}

}  // namespace specd
