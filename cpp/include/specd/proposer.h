// Proposer: model-free draft proposal (n-gram prompt lookup, suffix index) for many requests.
//
// Rules
// - A proposer keeps, per request, an index over the request's token history (prompt +
//   generated). The engine tells it every change: add_request (the prompt), append (tokens
//   that became part of the sequence: accepted drafts and bonus tokens), truncate (the
//   history got shorter, rare), remove_request (the request ended).
// - propose_batch answers for many requests in one call (one call per engine step). For
//   request i it returns a TokenTree rooted at the request's last token with depth <=
//   max_depth[i] and at most max_nodes[i] draft nodes (0 = no speculation: just the root),
//   and per-node acceptance estimates (TokenTreeBatch::node_probs).
// - Cost of propose_batch per request does not grow with the history length.
// - Proposers never see model outputs or probabilities; they are deterministic functions of
//   the token histories they were given (and, for the suffix proposer, of its global cache).
// - Every failed call returns a Status with a message and changes nothing.
#pragma once

#include <cstdint>

#include "specd/span.h"
#include "specd/status.h"
#include "specd/token_tree.h"

namespace specd {

using RequestId = int64_t;

enum class RemoveReason {
  kFinished,  // the request completed: its tokens may feed a global cache
  kAborted,   // the request was cancelled or failed: forget it
};

class Proposer {
 public:
  virtual ~Proposer() = default;

  virtual Status add_request(RequestId id, Span<const int32_t> prompt) = 0;
  virtual Status append(RequestId id, Span<const int32_t> tokens) = 0;
  virtual Status truncate(RequestId id, int64_t new_len) = 0;
  virtual Status remove_request(RequestId id, RemoveReason reason) = 0;
  virtual bool contains(RequestId id) const = 0;
  // Length of the request's history, or -1 for an unknown request.
  virtual int64_t history_length(RequestId id) const = 0;

  virtual Status propose_batch(Span<const RequestId> ids, Span<const int32_t> max_depth,
                               Span<const int32_t> max_nodes, TokenTreeBatch* out) = 0;
};

}  // namespace specd
