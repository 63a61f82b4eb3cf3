// Random batched-sampling inputs and their expected outputs from the CPU references
// (sampling_probs + sample_token), shared by the CPU and CUDA tests of batched sampling.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "specd/sampling.h"
#include "specd/sampling_batch.h"
#include "specd/verify.h"

namespace specd::testing {

struct SamplingCase {
  int32_t rows = 0, vocab = 0;
  int64_t stride = 0;
  std::vector<float> logits;  // [rows, stride]
  std::vector<SamplingParams> params;
  std::vector<RngKey> keys;
  LogitRows view() const { return LogitRows{logits.data(), LogitsDtype::kFloat32, rows, vocab, stride}; }
};

// Logits with ties (few distinct values), -inf entries, wide and narrow spreads; parameters
// from greedy to every filter combined, top_k around the vocabulary size.
inline SamplingCase random_sampling_case(std::mt19937_64* gen, int32_t rows, int32_t vocab) {
  std::mt19937_64& g = *gen;
  SamplingCase c;
  c.rows = rows;
  c.vocab = vocab;
  c.stride = vocab + static_cast<int64_t>(g() % 3);
  c.logits.assign(static_cast<std::size_t>(rows * c.stride), 12345.0f);  // padding must not be read
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int32_t r = 0; r < rows; ++r) {
    const int style = static_cast<int>(g() % 5);
    const float spread = style == 0 ? 0.5f : style == 1 ? 2.0f : 8.0f;
    std::normal_distribution<float> normal(0.0f, spread);
    float* row = c.logits.data() + r * c.stride;
    for (int32_t i = 0; i < vocab; ++i) {
      row[i] = style == 3 ? static_cast<float>(g() % 3)       // heavy ties
               : style == 4 ? 1.5f                              // all equal
                            : normal(g);
      if (vocab > 1 && g() % 10 == 0) row[i] = -INFINITY;
    }
    if (g() % 2 == 0) row[g() % static_cast<uint64_t>(vocab)] = 3.0f;  // at least one finite logit
    SamplingParams s;
    const int kind = static_cast<int>(g() % 8);
    s.temperature = kind == 0 ? 0.0 : std::vector<double>{0.3, 0.7, 1.0, 1.6}[g() % 4];
    const std::vector<int32_t> ks{0, 1, 2, 5, vocab - 1, vocab, vocab + 3};
    if (kind == 2 || kind >= 5) s.top_k = std::max(0, ks[g() % ks.size()]);
    if (kind == 3 || kind >= 6) s.top_p = g() % 4 == 0 ? 0.5 : 0.05 + 0.94 * unit(g);
    if (kind == 4 || kind == 7) s.min_p = 0.5 * unit(g);
    c.params.push_back(s);
    c.keys.push_back(RngKey{g(), static_cast<uint32_t>(g()), static_cast<uint32_t>(g() % 100),
                            static_cast<uint32_t>(g() % 5000)});
  }
  return c;
}

// Bad and edge rows, by r % 8: 0 a NaN at a random id, 1 +inf as the last logit (the last
// load group), 2 every logit -inf; rows with r % 8 == 3 get `fourth(row, at)` (`at` a
// random id). Other rows are left as they are.
template <class Fourth>
void mark_edge_rows(SamplingCase* c, std::mt19937_64* g, const Fourth& fourth) {
  for (int32_t r = 0; r < c->rows; ++r) {
    float* row = c->logits.data() + r * c->stride;
    const int32_t at = static_cast<int32_t>((*g)() % static_cast<uint64_t>(c->vocab));
    switch (r % 8) {
      case 0: row[at] = NAN; break;
      case 1: row[c->vocab - 1] = INFINITY; break;
      case 2: std::fill(row, row + c->vocab, -INFINITY); break;
      case 3: fourth(row, at); break;
      default: break;
    }
  }
}

struct SamplingExpected {
  std::vector<float> probs;    // [rows, vocab]
  std::vector<int32_t> tokens; // [rows], -1 where invalid
  std::vector<bool> ok;        // [rows]
};

inline SamplingExpected expected_sampling(const SamplingCase& c) {
  SamplingExpected e;
  e.probs.assign(static_cast<std::size_t>(c.rows) * c.vocab, 0.0f);
  e.tokens.assign(static_cast<std::size_t>(c.rows), -1);
  e.ok.assign(static_cast<std::size_t>(c.rows), false);
  for (int32_t r = 0; r < c.rows; ++r) {
    float* out = e.probs.data() + static_cast<std::size_t>(r) * c.vocab;
    const Status s = sampling_probs(Span<const float>(c.logits.data() + r * c.stride, static_cast<std::size_t>(c.vocab)),
                                    c.params[static_cast<std::size_t>(r)], Span<float>(out, static_cast<std::size_t>(c.vocab)));
    if (!s.ok()) {
      std::fill(out, out + c.vocab, 0.0f);
      continue;
    }
    e.ok[static_cast<std::size_t>(r)] = true;
    if (!sample_token(out, c.vocab, c.keys[static_cast<std::size_t>(r)], &e.tokens[static_cast<std::size_t>(r)]).ok())
      e.tokens[static_cast<std::size_t>(r)] = -2;  // never expected
  }
  return e;
}

}  // namespace specd::testing
