// Checks shared by the proposer tests.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "specd/proposer.h"

namespace specd::testing {

// propose_batch must reject bad batches (unknown or repeated id, mismatched sizes, negative
// limits) with a message and leave `out` exactly as it was. `known` is a live request of `p`,
// `unknown` is not.
inline void expect_batch_errors_leave_output(Proposer& p, RequestId known, RequestId unknown) {
  using Ints = std::vector<int32_t>;
  TokenTreeBatch out;
  out.append(TokenTree::chain(42, Ints{43}));
  const TokenTreeBatch before = out;
  auto fails_with = [&](const std::vector<RequestId>& ids, const Ints& depth, const Ints& nodes,
                        StatusCode code) {
    const Status s = p.propose_batch(ids, depth, nodes, &out);
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_FALSE(s.message().empty());
  };
  fails_with({known, unknown}, {3, 3}, {3, 3}, StatusCode::kNotFound);
  fails_with({known, known}, {3, 3}, {3, 3}, StatusCode::kInvalidArgument);  // duplicate id
  fails_with({known}, {3, 3}, {3}, StatusCode::kInvalidArgument);            // sizes differ
  fails_with({known}, {-1}, {3}, StatusCode::kInvalidArgument);
  fails_with({known}, {3}, {-1}, StatusCode::kInvalidArgument);
  EXPECT_EQ(out.offsets, before.offsets);
  EXPECT_EQ(out.tokens, before.tokens);
  EXPECT_EQ(out.node_probs, before.node_probs);
}

}  // namespace specd::testing
