// Batched verification on the CPU: the kernels' per-request algorithm
// (detail/verify_walk.h) run with a one-thread block, request after request.
#include "specd/verify_batch.h"

#include "specd/detail/logit_rows.h"
#include "specd/detail/serial_block.h"
#include "specd/detail/verify_walk.h"

namespace specd {
namespace {

// indexed: rows are found through an index (draft_index), so any number of them will do.
Status check_rows(const ProbRows& rows, const TreeBatchView& trees, const char* which, bool indexed = false) {
  if (rows.vocab <= 0 || rows.vocab > kMaxBatchVocab || rows.stride < rows.vocab)
    return error_status(StatusCode::kInvalidArgument, which, " rows: bad shape (vocab ", rows.vocab, ", stride ",
                        rows.stride, ")");
  if (rows.rows < 0)
    return error_status(StatusCode::kInvalidArgument, which, " rows: ", rows.rows, " rows");
  if (!indexed && rows.rows < trees.num_nodes)
    return error_status(StatusCode::kInvalidArgument, which, " rows: ", rows.rows, " rows for ", trees.num_nodes,
                        " nodes; one row per node is needed");
  if (rows.rows > 0 && rows.data == nullptr)
    return error_status(StatusCode::kInvalidArgument, which, " rows: null data");
  return Status::Ok();
}

Status validate_tree_batch(const TreeBatchView& t) {
  if (t.batch < 0 || t.num_nodes < 0)
    return error_status(StatusCode::kInvalidArgument, "tree batch: batch ", t.batch, " and num_nodes ", t.num_nodes,
                        " must be >= 0");
  if (t.batch > 0 && t.node_offsets == nullptr)
    return error_status(StatusCode::kInvalidArgument, "tree batch: null node_offsets for ", t.batch, " requests");
  if (t.num_nodes > 0 && (t.parents == nullptr || t.tokens == nullptr))
    return error_status(StatusCode::kInvalidArgument, "tree batch: null parents or tokens for ", t.num_nodes, " nodes");
  return Status::Ok();
}

Status validate_verify_outputs(const TreeBatchView& trees, const VerifyOutputs& out) {
  if (out.stride < 0)
    return error_status(StatusCode::kInvalidArgument, "verify outputs: stride ", out.stride, " must be >= 0");
  if (trees.batch > 0 && (out.num_accepted == nullptr || out.status == nullptr))
    return error_status(StatusCode::kInvalidArgument, "verify outputs: null num_accepted or status");
  const bool has_range = out.stride > 0 ? trees.batch > 0 : trees.num_nodes > 0;
  if (has_range && out.tokens == nullptr)
    return error_status(StatusCode::kInvalidArgument, "verify outputs: null tokens");
  return Status::Ok();
}

// The draft rows and options of stochastic verification, for a target of `vocab` tokens.
Status validate_draft_for(const TreeBatchView& trees, int32_t vocab, const ProbRows* draft, DraftSampling sampling,
                          const StochasticRowOptions& options) {
  if (draft == nullptr && (options.draft_index != nullptr || options.draft_totals != nullptr))
    return error_status(StatusCode::kInvalidArgument, "draft_index or draft_totals given without draft rows");
  if (draft != nullptr) {
    SPECD_RETURN_IF_ERROR(check_rows(*draft, trees, "draft", options.draft_index != nullptr));
    if (draft->vocab != vocab)
      return error_status(StatusCode::kInvalidArgument, "draft vocab ", draft->vocab, " differs from target vocab ",
                          vocab);
    if (sampling != DraftSampling::kWithoutReplacement && sampling != DraftSampling::kIndependent)
      return error_status(StatusCode::kInvalidArgument, "unknown DraftSampling ", static_cast<int32_t>(sampling));
  }
  return Status::Ok();
}

}  // namespace

Status validate_verify_greedy(const TreeBatchView& trees, const LogitRows& target, const VerifyOutputs& out) {
  SPECD_RETURN_IF_ERROR(validate_tree_batch(trees));
  SPECD_RETURN_IF_ERROR(validate_verify_outputs(trees, out));
  SPECD_RETURN_IF_ERROR(validate_logit_rows(target));
  if (target.rows < trees.num_nodes)
    return error_status(StatusCode::kInvalidArgument, "target rows: ", target.rows, " rows for ", trees.num_nodes,
                        " nodes; one row per node is needed");
  return Status::Ok();
}

Status validate_verify_greedy_tokens(const TreeBatchView& trees, const int32_t* target_tokens,
                                     const VerifyOutputs& out) {
  SPECD_RETURN_IF_ERROR(validate_tree_batch(trees));
  SPECD_RETURN_IF_ERROR(validate_verify_outputs(trees, out));
  if (trees.num_nodes > 0 && target_tokens == nullptr)
    return error_status(StatusCode::kInvalidArgument, "verify_greedy_tokens: null target_tokens");
  return Status::Ok();
}

Status validate_verify_stochastic(const TreeBatchView& trees, const ProbRows& target, const ProbRows* draft,
                                  DraftSampling sampling, const RngKey* rng, const VerifyOutputs& out,
                                  const StochasticRowOptions& options) {
  SPECD_RETURN_IF_ERROR(validate_tree_batch(trees));
  SPECD_RETURN_IF_ERROR(validate_verify_outputs(trees, out));
  SPECD_RETURN_IF_ERROR(check_rows(target, trees, "target"));
  SPECD_RETURN_IF_ERROR(validate_draft_for(trees, target.vocab, draft, sampling, options));
  if (trees.batch > 0 && rng == nullptr)
    return error_status(StatusCode::kInvalidArgument, "verify_stochastic: null rng");
  return Status::Ok();
}

Status validate_verify_stochastic_logits(const TreeBatchView& trees, const TargetLogits& target,
                                         const ProbRows* draft, DraftSampling sampling, const RngKey* rng,
                                         const VerifyOutputs& out, const StochasticRowOptions& options) {
  SPECD_RETURN_IF_ERROR(validate_tree_batch(trees));
  SPECD_RETURN_IF_ERROR(validate_verify_outputs(trees, out));
  SPECD_RETURN_IF_ERROR(validate_logit_rows(target.logits));
  if (target.row_index == nullptr && target.logits.rows < trees.num_nodes)
    return error_status(StatusCode::kInvalidArgument, "target logits: ", target.logits.rows, " rows for ",
                        trees.num_nodes, " nodes; one row per node is needed (or a row_index)");
  if (trees.batch > 0 && target.params == nullptr)
    return error_status(StatusCode::kInvalidArgument, "verify_stochastic from logits: null params");
  if (options.target_totals != nullptr)
    return error_status(StatusCode::kInvalidArgument,
                        "verify_stochastic from logits takes no target_totals: the walk sums the rows it plans");
  SPECD_RETURN_IF_ERROR(validate_draft_for(trees, target.logits.vocab, draft, sampling, options));
  if (trees.batch > 0 && rng == nullptr)
    return error_status(StatusCode::kInvalidArgument, "verify_stochastic: null rng");
  return Status::Ok();
}

Status verify_greedy_batch_cpu(const TreeBatchView& trees, const LogitRows& target, const VerifyOutputs& out) {
  SPECD_RETURN_IF_ERROR(validate_verify_greedy(trees, target, out));
  detail::SerialBlock b;
  detail::dispatch_logits_dtype(target.dtype, [&](auto tag) {
    using Row = decltype(tag);
    for (int32_t r = 0; r < trees.batch; ++r) {
      detail::verify_request(b, trees, r, target.vocab, out, [&](const detail::RequestNodes& n, detail::Emitter& e) {
        return detail::greedy_walk(b, n, e, [&](int32_t node, int32_t* token) {
          return detail::row_argmax(b, Row::at(target.data, int64_t{n.begin + node} * target.stride), target.vocab,
                                    token);
        });
      });
    }
  });
  return Status::Ok();
}

Status verify_greedy_tokens_batch_cpu(const TreeBatchView& trees, const int32_t* target_tokens,
                                      const VerifyOutputs& out) {
  SPECD_RETURN_IF_ERROR(validate_verify_greedy_tokens(trees, target_tokens, out));
  detail::SerialBlock b;
  for (int32_t r = 0; r < trees.batch; ++r) {
    detail::verify_request(b, trees, r, 0, out, [&](const detail::RequestNodes& n, detail::Emitter& e) {
      return detail::greedy_walk(b, n, e, [&](int32_t node, int32_t* token) {
        *token = target_tokens[n.begin + node];
        return *token < 0 ? VerifyStatus::kBadToken : VerifyStatus::kOk;
      });
    });
  }
  return Status::Ok();
}

Status verify_stochastic_batch_cpu(const TreeBatchView& trees, const ProbRows& target, const ProbRows* draft,
                                   DraftSampling sampling, const RngKey* rng, const VerifyOutputs& out,
                                   const StochasticRowOptions& options) {
  SPECD_RETURN_IF_ERROR(validate_verify_stochastic(trees, target, draft, sampling, rng, out, options));
  const ProbRows no_draft{};
  detail::SerialBlock b;
  detail::Rejection rejected[kMaxVerifyChildren];
  for (int32_t r = 0; r < trees.batch; ++r) {
    detail::verify_request(b, trees, r, target.vocab, out, [&](const detail::RequestNodes& n, detail::Emitter& e) {
      detail::ProbTarget rows{target, options.target_totals};
      return detail::stochastic_walk(b, n, e, rows, draft != nullptr ? *draft : no_draft, options, sampling, rng[r],
                                     rejected);
    });
  }
  return Status::Ok();
}

Status verify_stochastic_logits_batch_cpu(const TreeBatchView& trees, const TargetLogits& target,
                                          const ProbRows* draft, DraftSampling sampling, const RngKey* rng,
                                          const VerifyOutputs& out, const StochasticRowOptions& options) {
  SPECD_RETURN_IF_ERROR(validate_verify_stochastic_logits(trees, target, draft, sampling, rng, out, options));
  const ProbRows no_draft{};
  detail::SerialBlock b;
  detail::Rejection rejected[kMaxVerifyChildren];
  detail::RowPlan plan;
  detail::dispatch_logits_dtype(target.logits.dtype, [&](auto tag) {
    using Row = decltype(tag);
    for (int32_t r = 0; r < trees.batch; ++r) {
      const int32_t vocab = target.logits.vocab;
      detail::verify_request(b, trees, r, vocab, out, [&](const detail::RequestNodes& n, detail::Emitter& e) {
        detail::LogitTarget<Row> rows{target.logits, target.row_index, target.params[r], &plan};
        return detail::stochastic_walk(b, n, e, rows, draft != nullptr ? *draft : no_draft, options, sampling,
                                       rng[r], rejected);
      });
    }
  });
  return Status::Ok();
}

}  // namespace specd
