// Proposer benchmark: the host cost of model-free draft proposal per request and engine step.
//
// For the n-gram (prompt lookup) and suffix (SuffixDecoding-style) proposers: propose latency
// per request (one propose_batch call per engine step over a batch of B, divided by B; depth
// 8, budget 16 nodes) for histories of 1k..128k tokens and batches of 1..256; append cost per
// token (bulk from a prompt, and one-token append() calls); index memory per token. The
// claim to check: under 10 us per request, flat in the history length.
//
// Workload: each point runs B live requests (the engine's batch) whose histories are windows
// of one token stream; request r's window ends at the same position for every history
// length, so all lengths propose for the same continuations. A step appends one token to
// each (the accepted token; timed apart) and times one propose_batch over all B, so each
// call sees new suffixes; histories grow by steps x (reps + 1) tokens (384 by default). The
// working set is B x history: past the CPU caches it, not the algorithm, makes the cost
// grow. The stream is synthetic by default (Zipf tokens over a 32k vocabulary, ~40% of it
// re-inserted earlier segments, like code or chat with repetition), or the bytes of
// --corpus FILE (tokens 0..255, repeated as needed). The suffix proposer's global cache
// holds 16 finished outputs of 4096 tokens of the same stream, from outside every window.
// A second section times verification per step (greedy and stochastic, chains and trees,
// vocabularies of 32k and 152k; bench/verify_timing.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.h"
#include "verify_timing.h"
#include "specd/ngram_proposer.h"
#include "specd/suffix_proposer.h"

namespace {

using specd::Proposer;
using specd::RequestId;
using specd::Status;
namespace bench = specd::bench;

constexpr const char* kUsage =
    "usage: specd_bench_proposers [--quick] [--reps N] [--json PATH] [--corpus FILE]\n"
    "                             [--max-tokens N]\n"
    "  Times propose_batch per request (ngram, suffix) for histories 1k..128k and batches\n"
    "  1..256 (median of N reps). --corpus: a file's bytes as tokens instead of the synthetic\n"
    "  stream; --max-tokens: cap on live history tokens per point (default 40M).";

constexpr int32_t kDepth = 8;
constexpr int32_t kNodes = 16;
constexpr int64_t kStride = 4099;  // offset between request windows in the stream

void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

struct Options {
  bench::Flags flags;
  std::string corpus;
  int64_t max_tokens = 40'000'000;
};

// Takes out --corpus and --max-tokens, hands the rest to bench::Flags.
Options parse(int argc, char** argv) {
  Options o;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--corpus") && i + 1 < argc) {
      o.corpus = argv[++i];
    } else if (!std::strcmp(argv[i], "--max-tokens") && i + 1 < argc) {
      o.max_tokens = std::atoll(argv[++i]);
      if (o.max_tokens < 1) bench::Flags::die(kUsage, "--max-tokens must be >= 1");
    } else {
      rest.push_back(argv[i]);
    }
  }
  o.flags = bench::Flags::parse(static_cast<int>(rest.size()), rest.data(), kUsage);
  return o;
}

// ---- token streams ----

constexpr int kCacheDocs = 16;
constexpr int kCacheDocLen = 4096;  // tokens generated per cached document

struct Workload {
  std::string label;            // "synthetic" or the corpus file name
  std::vector<int32_t> stream;  // request r's history ends at stream[end(r)] (see make_live)
  int64_t max_history = 0;      // the longest history of the sweep
  std::size_t cache_base = 0;   // cached documents: stream[cache_base, ...), after all windows
};

std::vector<int32_t> synthetic_stream(std::size_t n) {
  constexpr int kVocab = 32768;
  std::vector<double> weights(kVocab);
  for (int r = 0; r < kVocab; ++r) weights[static_cast<std::size_t>(r)] = 1.0 / std::pow(r + 1.0, 1.1);
  std::discrete_distribution<int32_t> zipf(weights.begin(), weights.end());
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int32_t> s;
  s.reserve(n);
  while (s.size() < n) {
    if (s.size() > 256 && u(rng) < 0.01) {  // re-insert an earlier segment of 16..128 tokens
      const std::size_t len = 16 + rng() % 113, from = rng() % (s.size() - len);
      for (std::size_t i = 0; i < len && s.size() < n; ++i) s.push_back(s[from + i]);
    } else {
      s.push_back(zipf(rng));
    }
  }
  return s;
}

Workload make_workload(const std::string& corpus, std::size_t n) {
  if (corpus.empty()) return Workload{"synthetic", synthetic_stream(n)};
  std::ifstream f(corpus, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!f.good() && !f.eof()) bench::Flags::die(kUsage, ("cannot read " + corpus).c_str());
  if (bytes.empty()) bench::Flags::die(kUsage, ("empty corpus " + corpus).c_str());
  Workload w{corpus.substr(corpus.find_last_of('/') + 1), {}};
  w.stream.reserve(n);
  for (std::size_t i = 0; i < n; ++i) w.stream.push_back(static_cast<unsigned char>(bytes[i % bytes.size()]));
  return w;
}

// ---- proposers ----

std::unique_ptr<Proposer> make_proposer(const std::string& kind) {
  if (kind == "ngram") {
    std::unique_ptr<specd::NgramProposer> p;
    check(specd::NgramProposer::create(specd::NgramConfig{}, &p), "NgramProposer::create");
    return p;
  }
  std::unique_ptr<specd::SuffixProposer> p;
  check(specd::SuffixProposer::create(specd::SuffixConfig{}, &p), "SuffixProposer::create");
  return p;
}

int64_t memory_of(const Proposer& p) {
  if (auto* n = dynamic_cast<const specd::NgramProposer*>(&p)) return n->memory_bytes();
  return dynamic_cast<const specd::SuffixProposer&>(p).memory_bytes();
}

// Live requests of one (proposer, history length) setup.
struct Live {
  std::unique_ptr<Proposer> proposer;
  std::vector<RequestId> ids;
  std::vector<int64_t> next;  // next stream index to append, per request
  double append_ns_per_token = 0;
  double bytes_per_token = 0;
};

Live make_live(const std::string& kind, const Workload& w, int64_t history, int live) {
  Live l;
  l.proposer = make_proposer(kind);
  if (kind == "suffix") {  // fill the global cache with finished outputs
    for (int d = 0; d < kCacheDocs; ++d) {
      const int32_t* doc = w.stream.data() + w.cache_base + static_cast<std::size_t>(d) * (kCacheDocLen + 1);
      check(l.proposer->add_request(-1 - d, specd::Span<const int32_t>(doc, 1)), "cache add");
      check(l.proposer->append(-1 - d, specd::Span<const int32_t>(doc + 1, kCacheDocLen)), "cache append");
      check(l.proposer->remove_request(-1 - d, specd::RemoveReason::kFinished), "cache finish");
    }
  }
  const int64_t cache_bytes = memory_of(*l.proposer);  // reported apart from the live indexes
  const double t0 = bench::now_ns();
  for (int r = 0; r < live; ++r) {
    // Request r's history ends at the same place for every history length, so every point
    // proposes for the same continuations; longer histories only add earlier tokens.
    const int64_t end = w.max_history + r * kStride;
    const int32_t* h = w.stream.data() + (end - history);
    l.ids.push_back(r);
    l.next.push_back(end);
    check(l.proposer->add_request(r, specd::Span<const int32_t>(h, static_cast<std::size_t>(history))), "add_request");
  }
  const double tokens = static_cast<double>(history) * live;
  l.append_ns_per_token = (bench::now_ns() - t0) / tokens;
  l.bytes_per_token = static_cast<double>(memory_of(*l.proposer) - cache_bytes) / tokens;
  return l;
}

struct StepStats {
  double ns = 0;         // propose_batch time
  double append_ns = 0;  // time of the one-token append() calls
  double nodes = 0;      // draft nodes proposed
  double expect = 0;     // sum of node_probs over drafts
};

// `steps` engine steps over all of l's requests; returns totals.
StepStats run_steps(Live& l, const Workload& w, int steps) {
  const std::vector<RequestId>& ids = l.ids;
  const std::vector<int32_t> depth(ids.size(), kDepth), nodes(ids.size(), kNodes);
  specd::TokenTreeBatch out;
  StepStats st;
  for (int s = 0; s < steps; ++s) {
    const double ta = bench::now_ns();
    for (std::size_t r = 0; r < ids.size(); ++r) {
      const int32_t tok = w.stream[static_cast<std::size_t>(l.next[r]++) % w.stream.size()];
      check(l.proposer->append(ids[r], specd::Span<const int32_t>(&tok, 1)), "append");
    }
    const double t0 = bench::now_ns();
    st.append_ns += t0 - ta;
    check(l.proposer->propose_batch(ids, depth, nodes, &out), "propose_batch");
    st.ns += bench::now_ns() - t0;
    bench::do_not_optimize(out.tokens.data());
    st.nodes += static_cast<double>(out.tokens.size() - ids.size());
    for (std::size_t i = 0; i < out.node_probs.size(); ++i)
      if (out.parents[i] >= 0) st.expect += out.node_probs[i];
  }
  return st;
}

struct Row {
  std::string proposer;
  int64_t history;
  int batch;
  double ns_per_request;  // median over reps
  double append_ns;       // per one-token append() in the steps, median over reps
  double drafts_per_request;
  double expected_accepted;
  double build_ns_per_token;  // add_request with the whole history, per token
  double bytes_per_token;     // index memory per history token
};

struct ProposalResults {
  std::vector<Row> rows;
  std::vector<std::pair<int64_t, int>> skipped;  // (history, batch) over --max-tokens
};

ProposalResults run_proposals(const Options& o, const Workload& w, const std::vector<int64_t>& hists,
                              const std::vector<int>& batches) {
  ProposalResults res;
  const int reps = o.flags.reps;
  std::printf("%-7s %8s %6s %12s %10s %11s %13s %12s\n", "", "history", "batch", "ns/request",
              "us/request", "drafts/req", "E[accepted]", "append ns");
  for (const std::string kind : {"ngram", "suffix"}) {
    for (int64_t hist : hists) {
      for (int b : batches) {
        if (static_cast<int64_t>(b) * hist > o.max_tokens) {
          res.skipped.emplace_back(hist, b);
          std::printf("%-7s %8lld %6d   skipped (more than --max-tokens live tokens)\n", kind.c_str(),
                      static_cast<long long>(hist), b);
          continue;
        }
        Live l = make_live(kind, w, hist, b);
        const int steps = std::max(8, std::min(64, 1024 / b));
        run_steps(l, w, steps);  // warm-up (also absorbs each index's first growth)
        std::vector<double> ns, append_ns;
        StepStats total;
        for (int rep = 0; rep < reps; ++rep) {
          const StepStats st = run_steps(l, w, steps);
          ns.push_back(st.ns / (static_cast<double>(steps) * b));
          append_ns.push_back(st.append_ns / (static_cast<double>(steps) * b));
          total.nodes += st.nodes;
          total.expect += st.expect;
        }
        const double proposals = static_cast<double>(reps) * steps * b;
        res.rows.push_back(Row{kind, hist, b, bench::median(ns), bench::median(append_ns),
                               total.nodes / proposals, total.expect / proposals,
                               l.append_ns_per_token, l.bytes_per_token});
        const Row& r = res.rows.back();
        std::printf("%-7s %8lld %6d %12.0f %10.2f %11.2f %13.2f %12.0f\n", kind.c_str(),
                    static_cast<long long>(hist), b, r.ns_per_request, r.ns_per_request / 1000.0,
                    r.drafts_per_request, r.expected_accepted, r.append_ns);
      }
    }
  }
  std::printf("\nbulk append cost and index memory per history token (building the largest batch's\n"
              "indexes from their prompts; the suffix proposer's cache not included):\n");
  for (const Row& r : res.rows) {
    bool largest = true;
    for (const Row& other : res.rows)
      largest &= !(other.proposer == r.proposer && other.history == r.history && other.batch > r.batch);
    if (largest)
      std::printf("  %-7s history %7lld (batch %3d): %8.1f ns/token, %6.1f bytes/token\n",
                  r.proposer.c_str(), static_cast<long long>(r.history), r.batch,
                  r.build_ns_per_token, r.bytes_per_token);
  }
  return res;
}

// Flatness in history length per (proposer, batch), per request and per draft node (longer
// histories give longer matches and so larger suffix trees), and the 10 us check.
void summarize(const ProposalResults& res, const std::vector<int>& batches, bench::JsonWriter& w) {
  std::printf("\nhistory-length dependence (max / min over history lengths):\n");
  std::printf("  %-7s %6s %12s %14s\n", "", "batch", "ns/request", "ns/draft node");
  double worst_ratio = 1.0, worst_per_draft = 1.0, slowest = 0.0;
  w.key("flatness");
  w.begin_array();
  for (const std::string kind : {"ngram", "suffix"})
    for (int b : batches) {
      double lo = 1e300, hi = 0, lo_d = 1e300, hi_d = 0;
      for (const Row& r : res.rows)
        if (r.proposer == kind && r.batch == b) {
          const double per_draft = r.ns_per_request / std::max(1e-9, r.drafts_per_request);
          lo = std::min(lo, r.ns_per_request);
          hi = std::max(hi, r.ns_per_request);
          lo_d = std::min(lo_d, per_draft);
          hi_d = std::max(hi_d, per_draft);
        }
      if (hi == 0) continue;
      worst_ratio = std::max(worst_ratio, hi / lo);
      worst_per_draft = std::max(worst_per_draft, hi_d / lo_d);
      slowest = std::max(slowest, hi);
      std::printf("  %-7s %6d %11.2fx %13.2fx\n", kind.c_str(), b, hi / lo, hi_d / lo_d);
      w.begin_object();
      w.field("proposer", kind);
      w.field("batch", b);
      w.field("max_over_min", hi / lo);
      w.field("max_over_min_per_draft", hi_d / lo_d);
      w.end_object();
    }
  w.end_array();
  std::printf("worst max/min ratio across history lengths: %.2fx per request, %.2fx per draft node\n",
              worst_ratio, worst_per_draft);
  std::printf("(work per draft node does not depend on the history length; the working set,\n"
              " batch x history x bytes/token, does, and outgrows the CPU caches)\n");
  std::printf("slowest point %.2f us per request (target < 10 us): %s\n", slowest / 1000.0,
              slowest < 10000.0 ? "met" : "NOT met");
  w.field("max_over_min_across_history", worst_ratio);
  w.field("max_over_min_across_history_per_draft", worst_per_draft);
  w.field("slowest_ns_per_request", slowest);
  w.field("target_ns_per_request", 10000.0);
  w.field("target_met", slowest < 10000.0);
}

void write_proposals_json(const ProposalResults& res, bench::JsonWriter& w) {
  w.key("propose");
  w.begin_array();
  for (const Row& r : res.rows) {
    w.begin_object();
    w.field("proposer", r.proposer);
    w.field("history", static_cast<long long>(r.history));
    w.field("batch", r.batch);
    w.field("ns_per_request", r.ns_per_request);
    w.field("us_per_request", r.ns_per_request / 1000.0);
    w.field("append_ns_per_token", r.append_ns);
    w.field("bulk_append_ns_per_token", r.build_ns_per_token);
    w.field("index_bytes_per_token", r.bytes_per_token);
    w.field("drafts_per_request", r.drafts_per_request);
    w.field("expected_accepted_per_request", r.expected_accepted);
    w.end_object();
  }
  w.end_array();
  w.key("skipped");
  w.begin_array();
  for (const auto& [hist, batch] : res.skipped) {
    w.begin_object();
    w.field("history", static_cast<long long>(hist));
    w.field("batch", batch);
    w.end_object();
  }
  w.end_array();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const bool quick = o.flags.quick;
  const std::vector<int64_t> hists = quick ? std::vector<int64_t>{1024, 8192}
                                           : std::vector<int64_t>{1024, 8192, 32768, 131072};
  const std::vector<int> batches = quick ? std::vector<int>{1, 16} : std::vector<int>{1, 16, 64, 256};
  // Request windows: the largest batch's offsets + history + tokens appended while timing;
  // the cache's documents after them.
  const std::size_t cache_base = static_cast<std::size_t>(256 * kStride + hists.back() + 65536);
  Workload w = make_workload(o.corpus, cache_base + kCacheDocs * (kCacheDocLen + 1));
  w.cache_base = cache_base;
  w.max_history = hists.back();

  std::printf("specd proposers: propose_batch time per request (median of %d reps), workload: %s\n",
              o.flags.reps, w.label.c_str());
  std::printf("depth %d, budget %d nodes; one propose_batch call per engine step over the batch\n\n",
              kDepth, kNodes);

  bench::JsonWriter json;
  json.begin_object();
  json.field("benchmark", "proposers");
  json.field("workload", w.label);
  json.field("unit", "ns per request per propose_batch call");
  json.field("depth", kDepth);
  json.field("budget_nodes", kNodes);
  json.field("reps", o.flags.reps);
  json.field("quick", quick);
  bench::write_build_info(json);

  // Section 1: proposal latency vs history length and batch size.
  const ProposalResults proposals = run_proposals(o, w, hists, batches);
  write_proposals_json(proposals, json);
  summarize(proposals, batches, json);

  // Section 2: verification time per step (CPU reference), bench/verify_timing.h.
  bench::write_verify_json(json, bench::time_verification(o.flags));

  json.end_object();
  if (!o.flags.json_path.empty()) {
    if (!json.write_file(o.flags.json_path)) {
      std::fprintf(stderr, "cannot write %s\n", o.flags.json_path.c_str());
      return 1;
    }
    std::printf("\nwrote %s\n", o.flags.json_path.c_str());
  }
  return 0;
}
