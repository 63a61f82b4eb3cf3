// Block-manager benchmark: the cost of one speculative step's KV bookkeeping per sequence.
//
// One sequence-step is what an engine does for a request in one speculative step with a
// draft model: reserve k + 1 target slots (last token + k drafts) and k draft slots, commit
// 1 + a target and a draft slots for a random number a of accepted drafts, then roll both
// back to the starting length so the history length stays fixed across the run. It is
// measured for batches of 1..1024 sequences whose history is 128..32k tokens, with the
// per-sequence API and with the batched API (reserve_batch / commit_batch). The claim to
// check: the cost depends on k, not on the history length, and stays under 1 us.
// A second table times block-table export (CSR), which is O(pages) by nature.
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "bench_common.h"
#include "specd/block_manager.h"

namespace {

using specd::BlockManager;
using specd::Reservation;
using specd::SeqId;
using specd::Status;

constexpr const char* kUsage =
    "usage: specd_bench_block_manager [--quick] [--reps N] [--json PATH]\n"
    "  Times reserve/commit/rollback cycles per sequence-step for 1..1024 sequences,\n"
    "  history lengths 128..32768 and k in {1, 4, 8, 16}; prints a table (median of N reps).";

// Qwen2.5-Coder-1.5B / -0.5B KV bytes per token in bf16; 16 target tokens per page.
constexpr int64_t kTargetBytes = 28672;
constexpr int64_t kDraftBytes = 12288;

void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

struct Setup {
  std::unique_ptr<BlockManager> bm;
  std::vector<SeqId> ids;
};

Setup make_setup(int seqs, int64_t hist, int k) {
  specd::BlockManagerConfig c;
  c.page_bytes = 16 * kTargetBytes;
  c.models = {{"target", kTargetBytes}, {"draft", kDraftBytes}};
  const int64_t per_seq = (hist + k + 1 + 15) / 16 + (hist + k + 36) / 37 + 2;
  c.num_pages = static_cast<int32_t>(per_seq * seqs);
  Setup s;
  check(BlockManager::create(c, &s.bm), "create");
  Reservation r;
  for (int i = 0; i < seqs; ++i) {
    s.ids.push_back(1000 + i);
    check(s.bm->add_sequence(s.ids.back()), "add_sequence");
    for (specd::ModelIndex m : {0, 1}) {
      check(s.bm->reserve(s.ids.back(), m, static_cast<int32_t>(hist), &r), "prefill reserve");
      check(s.bm->commit(s.ids.back(), m, static_cast<int32_t>(hist)), "prefill commit");
    }
  }
  return s;
}

// Returns ns per sequence-step for `steps` steps over all sequences, per-sequence API.
double run_single(Setup& s, int64_t hist, int k, int steps, const std::vector<int>& accepted) {
  Reservation r;
  std::size_t a_i = 0;
  const double t0 = specd::bench::now_ns();
  for (int step = 0; step < steps; ++step) {
    for (SeqId id : s.ids) {
      const int a = accepted[a_i++ % accepted.size()];
      check(s.bm->reserve(id, 0, k + 1, &r), "reserve target");
      check(s.bm->reserve(id, 1, k, &r), "reserve draft");
      check(s.bm->commit(id, 0, 1 + a), "commit target");
      check(s.bm->commit(id, 1, a), "commit draft");
      check(s.bm->rollback(id, 0, hist), "rollback target");
      check(s.bm->rollback(id, 1, hist), "rollback draft");
    }
    specd::bench::do_not_optimize(r.slots.data());
  }
  return (specd::bench::now_ns() - t0) / (static_cast<double>(steps) * static_cast<double>(s.ids.size()));
}

// The same step with reserve_batch / commit_batch (one call per model per step).
double run_batch(Setup& s, int64_t hist, int k, int steps, const std::vector<int>& accepted) {
  Reservation r;
  const std::size_t n = s.ids.size();
  std::vector<int32_t> kt(n, k + 1), kd(n, k), at(n), ad(n);
  std::size_t a_i = 0;
  const double t0 = specd::bench::now_ns();
  for (int step = 0; step < steps; ++step) {
    for (std::size_t i = 0; i < n; ++i) {
      ad[i] = accepted[a_i++ % accepted.size()];
      at[i] = ad[i] + 1;
    }
    check(s.bm->reserve_batch(0, s.ids, kt, &r), "reserve_batch target");
    check(s.bm->reserve_batch(1, s.ids, kd, &r), "reserve_batch draft");
    check(s.bm->commit_batch(0, s.ids, at), "commit_batch target");
    check(s.bm->commit_batch(1, s.ids, ad), "commit_batch draft");
    for (SeqId id : s.ids) {
      check(s.bm->rollback(id, 0, hist), "rollback target");
      check(s.bm->rollback(id, 1, hist), "rollback draft");
    }
    specd::bench::do_not_optimize(r.slots.data());
  }
  return (specd::bench::now_ns() - t0) / (static_cast<double>(steps) * static_cast<double>(n));
}

double run_export(Setup& s, int steps) {
  specd::BlockTableCsr csr;
  const double t0 = specd::bench::now_ns();
  for (int step = 0; step < steps; ++step) {
    check(s.bm->export_csr(0, s.ids, &csr), "export_csr");
    specd::bench::do_not_optimize(csr.indices.data());
  }
  return (specd::bench::now_ns() - t0) / (static_cast<double>(steps) * static_cast<double>(s.ids.size()));
}

struct Row {
  int seqs;
  int64_t hist;
  int k;
  double ns_single;
  double ns_batch;
};

}  // namespace

int main(int argc, char** argv) {
  const auto flags = specd::bench::Flags::parse(argc, argv, kUsage);
  const std::vector<int> seq_counts = flags.quick ? std::vector<int>{1, 64} : std::vector<int>{1, 16, 64, 256, 1024};
  const std::vector<int64_t> hists = flags.quick ? std::vector<int64_t>{128, 4096} : std::vector<int64_t>{128, 4096, 32768};
  const std::vector<int> ks = flags.quick ? std::vector<int>{1, 4} : std::vector<int>{1, 4, 8, 16};
  const double work = flags.quick ? 2e4 : 2e5;  // sequence-steps per repetition

  std::mt19937 rng(1);
  std::vector<Row> rows;
  std::printf("specd KV block manager: ns per sequence-step (median of %d reps)\n", flags.reps);
  std::printf("step = reserve(target, k+1) + reserve(draft, k) + commit(target, 1+a) + commit(draft, a)"
              " + rollback of both to the history length; a ~ U{0..k}\n\n");
  std::printf("%6s %8s %4s %14s %14s\n", "seqs", "history", "k", "per-seq API", "batched API");
  for (int seqs : seq_counts) {
    for (int k : ks) {
      // All history lengths of this (seqs, k) are timed in the same repetitions, interleaved,
      // so machine noise hits them alike and their ratio is meaningful.
      std::vector<Setup> setups;
      for (int64_t hist : hists) setups.push_back(make_setup(seqs, hist, k));
      std::vector<int> accepted(4096);
      for (int& a : accepted) a = static_cast<int>(rng() % static_cast<unsigned>(k + 1));
      const int steps = std::max(3, static_cast<int>(work / seqs));
      std::vector<std::vector<double>> single(hists.size()), batch(hists.size());
      for (std::size_t h = 0; h < hists.size(); ++h)
        run_single(setups[h], hists[h], k, std::max(1, steps / 10), accepted);  // warm-up
      for (int rep = 0; rep < flags.reps; ++rep)
        for (std::size_t h = 0; h < hists.size(); ++h) {
          single[h].push_back(run_single(setups[h], hists[h], k, steps, accepted));
          batch[h].push_back(run_batch(setups[h], hists[h], k, steps, accepted));
        }
      for (std::size_t h = 0; h < hists.size(); ++h) {
        check(setups[h].bm->check_invariants(), "check_invariants");
        rows.push_back(Row{seqs, hists[h], k, specd::bench::median(single[h]),
                           specd::bench::median(batch[h])});
        std::printf("%6d %8lld %4d %12.1f ns %12.1f ns\n", seqs, static_cast<long long>(hists[h]),
                    k, rows.back().ns_single, rows.back().ns_batch);
      }
    }
  }

  // Flatness: for each (seqs, k), the spread of cost across history lengths.
  std::printf("\nhistory-length dependence (max / min over history lengths, per-seq API):\n");
  double worst_ratio = 1.0, worst_ns = 0.0;
  for (int seqs : seq_counts)
    for (int k : ks) {
      double lo = 1e30, hi = 0;
      for (const Row& r : rows)
        if (r.seqs == seqs && r.k == k) {
          lo = std::min(lo, r.ns_single);
          hi = std::max(hi, r.ns_single);
        }
      worst_ratio = std::max(worst_ratio, hi / lo);
      worst_ns = std::max(worst_ns, hi);
      std::printf("  seqs %4d k %2d: %.2fx\n", seqs, k, hi / lo);
    }
  std::printf("slowest point %.1f ns per sequence-step (target < 1000 ns): %s\n", worst_ns,
              worst_ns < 1000 ? "met" : "NOT met");

  // Block-table export: O(pages), reported for completeness.
  std::printf("\nblock-table export (CSR, target), ns per sequence, 64 sequences:\n");
  std::vector<std::pair<int64_t, double>> exports;
  for (int64_t hist : hists) {
    Setup s = make_setup(64, hist, 1);
    std::vector<double> t;
    for (int rep = 0; rep < flags.reps; ++rep) t.push_back(run_export(s, flags.quick ? 20 : 200));
    exports.emplace_back(hist, specd::bench::median(t));
    std::printf("  history %6lld (%5lld pages): %10.1f ns\n", static_cast<long long>(hist),
                static_cast<long long>((hist + 15) / 16), exports.back().second);
  }

  if (!flags.json_path.empty()) {
    specd::bench::JsonWriter w;
    w.begin_object();
    w.field("benchmark", "block_manager");
    w.field("unit", "ns per sequence-step");
    w.field("step", "reserve(target,k+1)+reserve(draft,k)+commit(target,1+a)+commit(draft,a)+rollback both");
    w.field("reps", flags.reps);
    w.field("quick", flags.quick);
    specd::bench::write_build_info(w);
    w.key("results");
    w.begin_array();
    for (const Row& r : rows) {
      w.begin_object();
      w.field("seqs", r.seqs);
      w.field("history", static_cast<long long>(r.hist));
      w.field("k", r.k);
      w.field("ns_per_seq_step", r.ns_single);
      w.field("ns_per_seq_step_batched", r.ns_batch);
      w.end_object();
    }
    w.end_array();
    w.field("max_over_min_across_history", worst_ratio);
    w.field("slowest_ns_per_seq_step", worst_ns);
    w.field("target_ns_per_seq_step", 1000.0);
    w.key("export_csr_ns_per_seq");
    w.begin_array();
    for (const auto& [hist, ns] : exports) {
      w.begin_object();
      w.field("history", static_cast<long long>(hist));
      w.field("ns", ns);
      w.end_object();
    }
    w.end_array();
    w.end_object();
    if (!w.write_file(flags.json_path)) {
      std::fprintf(stderr, "cannot write %s\n", flags.json_path.c_str());
      return 1;
    }
    std::printf("\nwrote %s\n", flags.json_path.c_str());
  }
  return 0;
}
