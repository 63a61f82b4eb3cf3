// Sampling reference benchmark: the host time of sampling_probs (sampling.h, the CPU
// reference of the sampling rules) for one row of a 151,936-token vocabulary, by filter.
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

namespace {

constexpr const char* kUsage =
    "specd_bench_sampling [--reps N] [--quick] [--json PATH]\n"
    "  Times sampling_probs (the CPU reference) on one 151,936-token row per filter setting\n"
    "  (median of N repetitions, default 5; --quick: one).";

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
  std::printf("%-8s %-34s %10s %8s\n", "logits", "filters", "median ms", "kept");
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
      long long kept = 0;
      for (float p : out) kept += p > 0;
      const char* workload = peaked ? "peaked" : "flat";
      std::printf("%-8s %-34s %10.2f %8lld\n", workload, s.name, median(ms), kept);
      w.begin_object();
      w.field("logits", workload);
      w.field("filters", s.name);
      w.field("median_ms", median(ms));
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
