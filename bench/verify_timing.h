// Verification time per engine step (CPU reference, specd/verify.h), for the proposer
// benchmark binary: greedy and stochastic verification of chains and trees for a batch of
// requests, at the vocabulary sizes of real models. Rows are built so that every draft is
// accepted, the worst case: every node's row is read. Stochastic rows use draft == target.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.h"
#include "specd/sampling.h"
#include "specd/verify.h"

namespace specd::bench {

struct VerifyTiming {
  std::string mode;  // greedy_tokens | greedy | stochastic_draft_rows | stochastic_one_hot
  std::string shape; // chain8 | tree16
  int32_t vocab;
  int32_t batch;
  double us_per_step;     // whole batch
  double us_per_request;
};

// A tree whose path root -> ... along first children is accepted by rows made for it.
inline TokenTree timing_tree(const std::string& shape) {
  if (shape == "chain8") {
    std::vector<int32_t> drafts{11, 12, 13, 14, 15, 16, 17, 18};
    return TokenTree::chain(10, drafts);
  }
  // tree16: 4 children at the root, each with a chain of 3 (16 drafts).
  TokenTree t(10);
  for (int32_t b = 0; b < 4; ++b) {
    int32_t node = t.add_node(0, 20 + b);
    for (int32_t d = 0; d < 3; ++d) node = t.add_node(node, 30 + 4 * d + b);
  }
  return t;
}

// Rows [size, vocab]: small noise everywhere and the mass on the node's first child's token.
inline std::vector<float> accepting_rows(const TokenTree& t, int32_t vocab) {
  std::vector<float> rows(static_cast<std::size_t>(t.size()) * static_cast<std::size_t>(vocab));
  for (int32_t v = 0; v < t.size(); ++v) {
    float* row = rows.data() + static_cast<std::size_t>(v) * static_cast<std::size_t>(vocab);
    for (int32_t i = 0; i < vocab; ++i) row[i] = 1e-9f * static_cast<float>(1 + (i * 7919) % 1000);
    const int32_t child = t.first_child(v);
    row[child >= 0 ? t.token(child) : 1] = 1.0f;
  }
  return rows;
}

inline std::vector<VerifyTiming> time_verification(const Flags& flags) {
  const std::vector<int32_t> vocabs = flags.quick ? std::vector<int32_t>{32000} : std::vector<int32_t>{32000, 151936};
  const std::vector<int32_t> batches = flags.quick ? std::vector<int32_t>{1, 8} : std::vector<int32_t>{1, 16, 64};
  std::vector<VerifyTiming> out;
  std::printf("\nverification time per step (CPU reference, every draft accepted = worst case)\n");
  std::printf("%-22s %-7s %7s %6s %14s %14s\n", "mode", "tree", "vocab", "batch", "us/step", "us/request");
  for (const std::string shape : {"chain8", "tree16"}) {
    const TokenTree tree = timing_tree(shape);
    for (int32_t vocab : vocabs) {
      const std::vector<float> rows = accepting_rows(tree, vocab);
      const ProbRows view{rows.data(), tree.size(), vocab, vocab};
      std::vector<int32_t> argmaxes;  // what an engine computes on the device for greedy_tokens
      for (int32_t v = 0; v < tree.size(); ++v)
        argmaxes.push_back(argmax(Span<const float>(view.row(v), static_cast<std::size_t>(vocab))));
      for (const std::string mode : {"greedy_tokens", "greedy", "stochastic_draft_rows", "stochastic_one_hot"}) {
        for (int32_t batch : batches) {
          VerifyResult r;
          std::vector<double> reps;
          for (int rep = 0; rep < flags.reps; ++rep) {
            const double t0 = now_ns();
            for (int32_t i = 0; i < batch; ++i) {
              const RngKey key{1, static_cast<uint32_t>(i), static_cast<uint32_t>(rep), 100};
              Status s = mode == "greedy_tokens" ? verify_greedy_tokens(tree, argmaxes, &r)
                         : mode == "greedy" ? verify_greedy(tree, view, &r)
                         : mode == "stochastic_draft_rows"
                             ? verify_stochastic(tree, view, &view, DraftSampling::kWithoutReplacement, key, &r)
                             : verify_stochastic(tree, view, nullptr, DraftSampling::kIndependent, key, &r);
              if (!s.ok()) {
                std::fprintf(stderr, "verification failed: %s\n", s.to_string().c_str());
                std::exit(1);
              }
              do_not_optimize(r.tokens.data());
            }
            reps.push_back((now_ns() - t0) / 1e3);
          }
          const double us = median(reps);
          out.push_back(VerifyTiming{mode, shape, vocab, batch, us, us / batch});
          std::printf("%-22s %-7s %7d %6d %14.1f %14.1f\n", mode.c_str(), shape.c_str(), vocab, batch, us,
                      us / batch);
        }
      }
    }
  }
  return out;
}

inline void write_verify_json(JsonWriter& w, const std::vector<VerifyTiming>& rows) {
  w.key("verification");
  w.begin_array();
  for (const VerifyTiming& r : rows) {
    w.begin_object();
    w.field("mode", r.mode);
    w.field("tree", r.shape);
    w.field("vocab", r.vocab);
    w.field("batch", r.batch);
    w.field("us_per_step", r.us_per_step);
    w.field("us_per_request", r.us_per_request);
    w.end_object();
  }
  w.end_array();
}

}  // namespace specd::bench
