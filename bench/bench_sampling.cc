// Sampling reference benchmark: the host time of sampling_probs (sampling.h, the CPU
// reference of the sampling rules) for one row of a 151,936-token vocabulary, by filter, and
// of sample_tokens_cpu (sampling_batch.h: the row code the CUDA kernels run, here with one
// thread, so its time counts the passes and the arithmetic per element the kernels do), with
// the inverse-CDF draw ("row code") and the Gumbel-max draw ("gumbel").
//
// Workloads (SYNTHETIC logits, seeded): "flat" is N(0, 2) logits, whose top-p 0.9 nucleus
// holds about a quarter of the vocabulary; "peaked" adds an LLM-like head of 40 strong
// tokens, whose nucleus is a handful. The filters rank only the prefix they read (a
// selection, then a sort of it; top-p doubles it as needed), so top-k and a small nucleus
// cost about a pass over the row, and a large nucleus about a sort of it.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "specd/sampling.h"
#include "specd/sampling_batch.h"

namespace {

constexpr const char* kUsage =
    "specd_bench_sampling [--reps N] [--quick] [--json PATH]\n"
    "  Times sampling_probs (the CPU reference) and sample_tokens_cpu (the kernels' row code,\n"
    "  one thread; inverse-CDF and Gumbel-max draws) on one 151,936-token row per filter setting (median of N repetitions,\n"
    "  default 5; --quick: one).";

struct Setting {
  const char* name;
  specd::SamplingParams params;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace specd::bench;
  const Flags flags = Flags::parse(argc, argv, kUsage);
  const int reps = flags.quick ? 1 : flags.reps;
  std::vector<Setting> settings(5);
  settings[0] = {"temperature 1", {}};
  settings[1] = {"top_k 50", {}};
  settings[1].params.top_k = 50;
  settings[2] = {"top_p 0.9", {}};
  settings[2].params.top_p = 0.9;
  settings[3] = {"min_p 0.05", {}};
  settings[3].params.min_p = 0.05;
  settings[4] = {"top_k 50, top_p 0.9, min_p 0.05", {}};
  settings[4].params.top_k = 50;
  settings[4].params.top_p = 0.9;
  settings[4].params.min_p = 0.05;

  JsonWriter w;
  w.begin_object();
  write_build_info(w);
  w.field("vocab", 151936);
  w.field("reps", reps);
  w.key("rows");
  w.begin_array();
  std::printf("%-8s %-34s %10s %14s %14s %8s\n", "logits", "filters", "median ms", "row code ms", "gumbel ms", "kept");
  for (const bool peaked : {false, true}) {
    std::mt19937 gen(1);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> logits(151936);
    for (float& l : logits) l = normal(gen);
    if (peaked)
      for (int i = 0; i < 40; ++i) logits[static_cast<std::size_t>(i) * 3000] += 14.0f - 0.3f * static_cast<float>(i);
    std::vector<float> out(logits.size());
    for (const Setting& s : settings) {
      std::vector<double> ms;
      for (int r = 0; r < reps; ++r) {
        const double t0 = now_ns();
        const specd::Status status = specd::sampling_probs(logits, s.params, out);
        ms.push_back((now_ns() - t0) * 1e-6);
        if (!status.ok()) {
          std::fprintf(stderr, "sampling_probs failed: %s\n", status.to_string().c_str());
          return 1;
        }
        do_not_optimize(out[0]);
      }
      // The same row through sample_tokens_cpu (sampling_batch.h, SerialBlock), with each draw rule.
      const specd::LogitRows rows{logits.data(), specd::LogitsDtype::kFloat32, 1, static_cast<int32_t>(logits.size()),
                                  static_cast<int64_t>(logits.size())};
      const specd::RngKey key{7, 1, 0, 0};
      const auto time_rows = [&](specd::DrawRule draw, std::vector<double>* row_ms) {
        for (int r = 0; r < reps; ++r) {
          int32_t token = -1, row_status = -1;
          const double t0 = now_ns();
          const specd::Status status = specd::sample_tokens_cpu(rows, &s.params, &key, &token, &row_status, draw);
          row_ms->push_back((now_ns() - t0) * 1e-6);
          if (!status.ok() || row_status != 0) {
            std::fprintf(stderr, "sample_tokens_cpu failed: %s (row status %d)\n", status.to_string().c_str(),
                         row_status);
            return false;
          }
          do_not_optimize(token);
        }
        return true;
      };
      std::vector<double> row_ms, gumbel_ms;
      if (!time_rows(specd::DrawRule::kInverseCdf, &row_ms) || !time_rows(specd::DrawRule::kGumbelMax, &gumbel_ms))
        return 1;
      long long kept = 0;
      for (float p : out) kept += p > 0;
      const char* workload = peaked ? "peaked" : "flat";
      std::printf("%-8s %-34s %10.2f %14.2f %14.2f %8lld\n", workload, s.name, median(ms), median(row_ms),
                  median(gumbel_ms), kept);
      w.begin_object();
      w.field("logits", workload);
      w.field("filters", s.name);
      w.field("median_ms", median(ms));
      w.field("row_code_median_ms", median(row_ms));
      w.field("gumbel_row_code_median_ms", median(gumbel_ms));
      w.field("kept_tokens", kept);
      w.end_object();
    }
  }
  w.end_array();
  w.end_object();
  if (!flags.json_path.empty() && !w.write_file(flags.json_path)) {
    std::fprintf(stderr, "cannot write %s\n", flags.json_path.c_str());
    return 1;
  }
  return 0;
}
