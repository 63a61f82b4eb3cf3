// Load forecast: how large the decode batch will be over the next requests' lifetimes. The
// goodput controller uses it to judge investments that pay off over many steps (a draft
// model's catch-up on a new request's prompt).
//
// Inputs, all measured while serving (nothing to tune):
// - the clock: the sum of the engine's step times (forwards plus overhead), so it works on
//   the wall clock and on a simulator's virtual clock alike; idle time is not counted, so
//   arrival rates are per busy second, which is what the batch size depends on;
// - arrivals: a request counts as arrived when it is first seen (arrive());
// - per arrival, its prompt tokens (the target's prefill work) and the tokens it may still
//   generate; per finished request, the tokens it did generate;
// - the scheduler's queue: requests waiting beyond the step's batch, and the batch limit;
// - per step that prefills, its prompt tokens (prefill()): how many the engine admits
//   together, which the goodput controller's backlog rule prices admissions by.
//
// Forecast (Little's law on the decode batch). With arrival rate lambda (the last kWindow
// arrivals over the clock since the oldest of them), R tokens per request (the mean at
// arrival until kMinFinished requests finished, then their measured lengths; exponential
// averages with weight kDecay kept), a plain decode step of T(N) seconds at batch N and a
// prefill costing P = T(N + prompt) - T(N) of target time, steps stretch by 1 / (1 - lambda
// P) to make room for prefills, and N = lambda R T(N) / (1 - lambda P), solved by fixed-point
// iteration. The result is:
// - the batch limit when requests are queued beyond the batch, or lambda P >= 1 (prefills
//   alone fill the engine);
// - the current batch before kMinArrivals arrivals or before the target has cost data
//   (kMinArrivals = 16: a Poisson process bunches its first few arrivals often enough that a
//   rate from three of them forecast the batch limit at the start of a run of 23.9
//   requests/s whose plain-decoding batch stayed near 25; at that batch drafting did not
//   pay, so the draft did not prefill the prompts admitted then, and those requests, their
//   catch-ups growing with every token, never drafted: 1.20x the best static k's latency,
//   0.98x with 16);
// - otherwise the fixed point, clamped to [current batch, batch limit].
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_set>

#include "specd/cost_model.h"
#include "specd/proposer.h"

namespace specd {

class LoadForecast {
 public:
  static constexpr std::size_t kWindow = 64;
  static constexpr std::size_t kMinArrivals = 16;
  static constexpr int32_t kMinFinished = 4;
  static constexpr double kDecay = 0.9;

  void tick(double seconds);
  void arrive(RequestId id, int64_t prompt_tokens, int64_t remaining_tokens);
  void finish(RequestId id, int64_t generated_tokens);
  void queue(int64_t waiting, int32_t max_batch);
  // One step's prompt tokens prefilled (the controller: its target forward beyond the decoding
  // requests' verification); steps without any (<= 0) are not counted.
  void prefill(int64_t prompt_tokens);

  // Arrivals per busy second, or nullopt before kMinArrivals arrivals.
  std::optional<double> rate(double step_seconds) const;
  // The forecast decode batch (rules above).
  int32_t batch(int32_t current, const CostModel& target) const;

  double clock() const { return clock_; }
  // The averages batch() uses: prompt tokens per arrival (nullopt before any arrival) and
  // tokens generated per request (measured once kMinFinished requests finished, before that
  // what arrivals may generate; 1 before any arrival).
  std::optional<double> prompt_tokens() const { return prompt_tokens_; }
  // Prompt tokens per step that prefills (nullopt before any): how admissions are batched.
  std::optional<double> prefill_chunk() const { return prefill_chunk_; }
  double request_tokens() const;

 private:
  double clock_ = 0.0;
  std::deque<double> arrivals_;
  std::unordered_set<RequestId> seen_;
  std::optional<double> prompt_tokens_, arrival_tokens_, generated_tokens_, prefill_chunk_;
  int32_t finished_ = 0;
  int64_t waiting_ = 0;
  int32_t max_batch_ = 0;  // 0: not told yet
};

}  // namespace specd
