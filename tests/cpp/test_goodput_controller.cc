// GoodputController and LoadForecast: the controller's per-step rules end to end on synthetic
// streams (no engine): a useless proposer goes to k = 0, a good one is used where
// verification is cheap and dropped where it is compute-bound, catch-ups are refused under
// a forecast saturating load, and the forecast follows Little's law.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "block_manager_test_util.h"
#include "specd/goodput_controller.h"
#include "specd/load_forecast.h"

namespace specd {
namespace {

// Seconds of a forward: flat to the knee, then linear (a memory-bound GPU).
double knee_seconds(int64_t tokens, double base, int64_t knee, double per_token) {
  return base + static_cast<double>(std::max<int64_t>(0, tokens - knee)) * per_token;
}

// A host time of `seconds` per step whatever the step does: plain steps of 1 and 64 requests
// measured alike (overhead_model.h).
void constant_overhead(GoodputController* c, double seconds) {
  EXPECT_TRUE(c->observe_overhead(seconds, StepShape{1, 0, 0, 0}).ok());
  EXPECT_TRUE(c->observe_overhead(seconds, StepShape{64, 0, 0, 0}).ok());
}

void teach(GoodputController* c, double target_base, double per_token, double draft_base) {
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t n : {1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256, 512, 1024}) {
      SPECD_ASSERT_OK(c->observe_forward(ForwardKind::kTarget, n, knee_seconds(n, target_base, 64, per_token)));
      SPECD_ASSERT_OK(c->observe_forward(ForwardKind::kDraft, n, knee_seconds(n, draft_base, 64, per_token / 5)));
    }
  constant_overhead(c, 0.0005);
}

CostModel flat_target() {
  CostModel c;
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t n : {1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256, 512, 1024})
      EXPECT_TRUE(c.observe(n, knee_seconds(n, 0.020, 64, 0.00025)).ok());
  return c;
}

// The controller without depth-1 exploration (AcceptanceEstimatorConfig::exploration_trials
// = 0): its decisions start from the prior, for the tests of rules that exploration would
// blur in their first steps (the prior's price of time, catch-ups, tree sizes).
GoodputControllerConfig unexplored_config(std::vector<bool> uses_draft, int32_t k_max) {
  GoodputControllerConfig config{std::move(uses_draft), k_max};
  config.acceptance.exploration_trials = 0.0;
  return config;
}

std::vector<ControllerRequest> decode_batch(int n, int32_t k_max, int32_t catch_up = 1, RequestId first = 0) {
  std::vector<ControllerRequest> b;
  for (int i = 0; i < n; ++i) b.push_back(ControllerRequest{first + i, 1, k_max, catch_up, 200});
  return b;
}

// Feeds `steps` verifications per request where each depth is accepted with probability
// `alpha` (deterministically: the first round(alpha * 10) of every 10 draws).
void run_steps(GoodputController* c, std::vector<ControllerRequest> batch, double alpha, int steps,
               std::vector<int32_t>* ks) {
  int draw = 0;
  for (int s = 0; s < steps; ++s) {
    std::vector<ControllerDecision> d;
    SPECD_ASSERT_OK(c->decide(batch, &d));
    for (std::size_t i = 0; i < batch.size(); ++i) {
      ks->push_back(d[i].k);
      if (d[i].k == 0) continue;
      int accepted = 0;
      while (accepted < d[i].k && (draw++ % 10) < static_cast<int>(alpha * 10 + 0.5)) ++accepted;
      SPECD_ASSERT_OK(c->observe(batch[i].id, d[i].proposer, d[i].k, accepted));
    }
  }
}

TEST(LoadForecast, RulesOfTheHeader) {
  const CostModel target = flat_target();
  LoadForecast f;
  f.queue(0, 64);
  f.arrive(1, 100, 64);
  EXPECT_FALSE(f.rate(0.02).has_value());
  EXPECT_EQ(f.batch(3, target), 3);  // no rate yet: the current batch
  f.queue(5, 48);
  EXPECT_EQ(f.batch(10, target), 48);  // queued beyond the batch: the limit

  LoadForecast light;  // 2 arrivals per busy second: N = 2 * 64 * 0.020 / (1 - 2 * 0.00925) ~ 2.6
  light.queue(0, 64);
  for (RequestId i = 0; i < 40; ++i) {
    light.arrive(i, 100, 64);
    light.tick(0.5);
  }
  EXPECT_NEAR(*light.rate(0.02), 2.0, 0.1);
  EXPECT_EQ(light.batch(1, target), 3);
  EXPECT_EQ(light.batch(12, target), 12);  // never below the current batch
  for (RequestId i = 0; i < 40; ++i) light.finish(i, 16);  // requests stop early: a smaller batch
  EXPECT_LE(light.batch(1, target), 2);

  LoadForecast heavy;  // 25 arrivals/s with 300-token prompts: prefills alone exceed capacity
  heavy.queue(0, 64);
  for (RequestId i = 0; i < 40; ++i) {
    heavy.arrive(i, 300, 64);
    heavy.tick(0.04);
  }
  EXPECT_EQ(heavy.batch(8, target), 64);

  // A burst at the start (8 arrivals within 4 steps of a load of 2/s) does not make a rate:
  // before kMinArrivals the forecast is the current batch. (With 3 arrivals enough, a burst
  // like this forecast the batch limit; at that batch drafting never pays, so the draft
  // never prefilled the prompts admitted then, and those requests never drafted.)
  LoadForecast burst;
  burst.queue(0, 64);
  for (RequestId i = 0; i < 8; ++i) {
    burst.arrive(i, 100, 64);
    burst.tick(0.01);
  }
  EXPECT_FALSE(burst.rate(0.02).has_value());
  EXPECT_EQ(burst.batch(8, target), 8);
  for (RequestId i = 8; i < static_cast<RequestId>(LoadForecast::kMinArrivals); ++i) {
    burst.arrive(i, 100, 64);
    burst.tick(0.5);
  }
  EXPECT_TRUE(burst.rate(0.02).has_value());

  LoadForecast chunks;  // prompt tokens per prefilling step, steps without prompts not counted
  EXPECT_FALSE(chunks.prefill_chunk().has_value());
  chunks.prefill(0);
  EXPECT_FALSE(chunks.prefill_chunk().has_value());
  chunks.prefill(1000);
  chunks.prefill(0);
  EXPECT_DOUBLE_EQ(*chunks.prefill_chunk(), 1000.0);
  chunks.prefill(2000);  // exponential average, kDecay kept
  EXPECT_DOUBLE_EQ(*chunks.prefill_chunk(), LoadForecast::kDecay * 1000.0 + (1 - LoadForecast::kDecay) * 2000.0);
}

TEST(GoodputController, UselessProposerGoesToZeroGoodOneIsUsed) {
  GoodputController bad(GoodputControllerConfig{{true}, 8});
  teach(&bad, 0.020, 0.00025, 0.004);
  std::vector<int32_t> ks;
  run_steps(&bad, decode_batch(4, 8), 0.0, 12, &ks);
  EXPECT_EQ(std::vector<int32_t>(ks.end() - 4, ks.end()), std::vector<int32_t>(4, 0));

  GoodputController good(GoodputControllerConfig{{true}, 8});
  teach(&good, 0.020, 0.00025, 0.004);
  ks.clear();
  run_steps(&good, decode_batch(4, 8), 0.9, 12, &ks);
  EXPECT_GE(ks.back(), 3);
}

TEST(GoodputController, ComputeBoundVerificationTurnsSpeculationOff) {
  // Every verified token costs as much as a whole memory-bound step would: no draft pays.
  GoodputController c(GoodputControllerConfig{{false}, 8});
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 128}) SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, n, 0.01 * n));
  std::vector<int32_t> ks;
  run_steps(&c, decode_batch(4, 8), 0.7, 6, &ks);
  EXPECT_EQ(std::vector<int32_t>(ks.end() - 4, ks.end()), std::vector<int32_t>(4, 0));
}

// The host time outside the forwards depends on what a step does (overhead_model.h): here a
// drafting request costs `per_drafting` seconds and a draft token `per_token` on top of a
// plain step's 0.5 ms. The controller learns that from each step's shape and prices it, so
// drafting stops where the host time eats the gain, on a GPU-like target whose verification
// is free; with a cheap host it goes on. (A step-overhead average would charge plain
// decoding the same time and cancel out of the comparison: drafting would look free.)
void run_steps_with_host(GoodputController* c, std::vector<ControllerRequest> batch, double alpha, int steps,
                         double per_drafting, double per_token, std::vector<int32_t>* ks) {
  int draw = 0;
  for (int s = 0; s < steps; ++s) {
    std::vector<ControllerDecision> d;
    SPECD_ASSERT_OK(c->decide(batch, &d));
    StepShape shape{static_cast<int64_t>(batch.size()), 0, 0, 0};
    for (std::size_t i = 0; i < batch.size(); ++i) {
      ks->push_back(d[i].k);
      if (d[i].k == 0) continue;
      ++shape.drafting_requests;
      shape.draft_tokens += d[i].k;
      int accepted = 0;
      while (accepted < d[i].k && (draw++ % 10) < static_cast<int>(alpha * 10 + 0.5)) ++accepted;
      SPECD_ASSERT_OK(c->observe(batch[i].id, d[i].proposer, d[i].k, accepted));
    }
    const double host = 0.0005 + per_drafting * static_cast<double>(shape.drafting_requests) +
                        per_token * static_cast<double>(shape.draft_tokens);
    SPECD_ASSERT_OK(c->observe_overhead(host, shape));
  }
}

TEST(GoodputController, LearnsAndPricesTheHostTimeOfSpeculation) {
  auto flat_gpu = [](GoodputController* c) {
    for (int rep = 0; rep < 3; ++rep)
      for (int64_t n : {1, 2, 4, 8, 16, 32, 64}) SPECD_ASSERT_OK(c->observe_forward(ForwardKind::kTarget, n, 0.0024));
  };
  // 8 requests at acceptance 0.6: two drafts each add 0.96 tokens for 1.1 ms of host time,
  // while plain decoding earns 8 tokens per 2.9 ms (2.3 tokens per 0.83 ms): not worth it.
  GoodputController dear(GoodputControllerConfig{{false}, 4});
  flat_gpu(&dear);
  std::vector<int32_t> ks;
  run_steps_with_host(&dear, decode_batch(8, 4), 0.6, 60, 0.001, 0.00005, &ks);
  EXPECT_GT(std::count_if(ks.begin(), ks.begin() + 16, [](int32_t k) { return k > 0; }), 0);  // it tried
  EXPECT_EQ(std::vector<int32_t>(ks.end() - 8, ks.end()), std::vector<int32_t>(8, 0));
  // What it learnt: the steps it ran (k = 4 for all, then plain) priced as measured.
  EXPECT_NEAR(dear.overhead().predict(StepShape{8, 8, 32, 0}), 0.0101, 0.0005);
  EXPECT_NEAR(dear.overhead().fixed(8), 0.0005, 0.0001);
  // The same with 20 us per drafting request and 5 us per draft token: drafting pays.
  GoodputController cheap(GoodputControllerConfig{{false}, 4});
  flat_gpu(&cheap);
  ks.clear();
  run_steps_with_host(&cheap, decode_batch(8, 4), 0.6, 60, 0.00002, 0.000005, &ks);
  EXPECT_EQ(std::count_if(ks.end() - 8, ks.end(), [](int32_t k) { return k > 0; }), 8);
  // Bad step shapes are errors, and nothing is learnt from them.
  const int64_t samples = cheap.overhead().samples();
  SPECD_EXPECT_CODE(cheap.observe_overhead(0.001, StepShape{4, -1, 0, 0}), kInvalidArgument);
  SPECD_EXPECT_CODE(cheap.observe_overhead(std::nan(""), StepShape{4, 0, 0, 0}), kInvalidArgument);
  EXPECT_EQ(cheap.overhead().samples(), samples);
  SPECD_ASSERT_OK(cheap.observe_overhead(-1e-12, StepShape{4, 0, 0, 0}));  // clock rounding: no host time
  EXPECT_EQ(cheap.overhead().samples(), samples + 1);
}

// A CPU-like target: plain decoding (1 token) and a prompt (104 tokens) were measured, and
// their line says 2 tokens cost 1.05x one, but really they cost 2x. The controller bets at
// most twice what it measured: k = 1 first (not the k >= 3 the line would buy), then at most
// 4 tokens, and once those sizes are measured (here a 4-token forward costs 4x one), none.
TEST(GoodputController, ExploresTheCostCurveByDoublings) {
  GoodputController c(GoodputControllerConfig{{true}, 8});
  SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, 104, 2.44));
  SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, 1, 0.37));
  SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kDraft, 1, 0.136));
  SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kDraft, 2, 0.228));
  // A useful draft: 7 of 10 proposals fully accepted, 3 rejected at once (alpha_1 ~ 0.7).
  for (int i = 0; i < 100; ++i) SPECD_ASSERT_OK(c.observe(100 + i, 0, 4, i % 10 < 7 ? 4 : 0));
  const std::vector<ControllerRequest> one = decode_batch(1, 8);
  std::vector<ControllerDecision> d;
  SPECD_ASSERT_OK(c.decide(one, &d));
  EXPECT_EQ(d[0].k, 1);  // the line would buy more; only 2 tokens are within reach
  SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, 2, 0.73));
  SPECD_ASSERT_OK(c.observe(one[0].id, 0, 1, 1));
  SPECD_ASSERT_OK(c.decide(one, &d));
  EXPECT_LE(d[0].k, 3);  // up to twice the 2 tokens measured
  SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, 3, 0.75));
  SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, 4, 1.45));
  SPECD_ASSERT_OK(c.decide(one, &d));
  EXPECT_EQ(d[0].k, 0) << "every measured multi-token verification costs more than it yields";
}

TEST(GoodputController, CatchUpIsRefusedUnderAForecastSaturation) {
  // A request that the draft has not seen (300 prompt tokens) arrives next to one in sync.
  // With no arrival rate known yet the forecast is today's batch of 2, where the catch-up
  // pays; with a queue beyond the batch the forecast is the batch limit (64), where drafting
  // no longer pays, so it does not catch up, while the request in sync still drafts.
  for (const bool queued : {false, true}) {
    GoodputController c(unexplored_config({true}, 8));
    teach(&c, 0.020, 0.00025, 0.004);
    std::vector<int32_t> warm;
    run_steps(&c, decode_batch(1, 8, 1, 100), 0.8, 10, &warm);  // learn the proposer's acceptance
    c.observe_load(queued ? 40 : 0, 64);
    std::vector<ControllerDecision> d;
    const std::vector<ControllerRequest> batch{{100, 1, 8, 1, 200}, {0, 1, 8, 300, 200}};
    SPECD_ASSERT_OK(c.decide(batch, &d));
    EXPECT_GT(d[0].k, 0) << "queued " << queued;
    EXPECT_EQ(d[1].k > 0, !queued) << "queued " << queued;
  }
}

// The forecast plan of the catch-up test (rule 4) is bound, like every plan, to the token
// counts the target was measured near (CostModel::explored_limit). At the start of a load
// ramp the target has run only prefill-heavy forwards (179 and 838 tokens here); the line
// through them prices 64 requests' verification as cheap as 64 tokens of prefill, and on it
// the forecast plan drafts k = 2 for everyone, where a new request's catch-up (180 tokens)
// pays from 50 tokens left. Within twice the forecast batch (128 verified tokens) the plan
// drafts k = 1, and the same catch-up pays only from about 60 tokens left. (On the
// H100-profile sweep at 620 requests/s, traces recorded in bfloat16, new requests caught up
// their drafts on that line for drafting that did not pay.) Once verification at the
// forecast batch has been measured, and found as cheap as the line, the catch-up pays.
TEST(GoodputController, TheCatchUpsForecastPlanStaysWithinMeasuredSizes) {
  for (const bool decode_measured : {false, true}) {
    GoodputController c(unexplored_config({true}, 8));
    for (int rep = 0; rep < 3; ++rep) {
      SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, 179, 0.00413));
      SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, 838, 0.01029));
      SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kDraft, 5, 0.0006));
      SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kDraft, 1007, 0.0046));
      if (decode_measured)
        for (int64_t n : {64, 128, 192, 256})  // on the line through the prefills
          SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, n, 0.00413 + (n - 179) * (0.01029 - 0.00413) / 659));
    }
    constant_overhead(&c, 0.0008);
    std::vector<int32_t> warm;
    run_steps(&c, decode_batch(8, 8, 1, 100), 0.8, 10, &warm);  // 8 requests in sync
    c.observe_load(0, 64);
    // Ten new requests at once, 50 tokens each to go: an arrival rate far above what 64
    // requests can serve, so the forecast batch is the limit.
    std::vector<ControllerRequest> batch = decode_batch(8, 8, 1, 100);
    for (ControllerRequest r : decode_batch(10, 8, 180, 0)) {
      r.remaining_tokens = 50;
      batch.push_back(r);
    }
    std::vector<ControllerDecision> d;
    SPECD_ASSERT_OK(c.decide(batch, &d));
    EXPECT_EQ(c.load().batch(static_cast<int32_t>(batch.size()), c.target_costs()), 64);
    EXPECT_GT(d[0].k, 0);  // the requests in sync draft either way
    int catching_up = 0;
    for (std::size_t i = 8; i < batch.size(); ++i) catching_up += d[i].k > 0;
    EXPECT_EQ(catching_up, decode_measured ? 10 : 0) << "decode sizes measured: " << decode_measured;
  }
}

TEST(GoodputController, CatchUpIsPricedByTheDraftsOwnCurveWhereTimed) {
  // A draft 5x cheaper than the target at one token and 25x cheaper per token above the
  // knee (on a 2-core CPU: 0.4x at one token, 0.25x at 179). A request 2,000 tokens behind
  // with 20 tokens to go: its catch-up costs 70 ms on the draft's measured curve, which pays,
  // but 0.2 x the target's 500 ms (the single-token ratio) beyond the sizes the draft was
  // timed at, which does not. So it catches up where the draft was timed at 1,024 tokens
  // (2,000 is within twice that) and not where it was timed up to 64 only.
  for (const int64_t timed_up_to : {1024, 64}) {
    GoodputController c(unexplored_config({true}, 8));
    for (int rep = 0; rep < 3; ++rep)
      for (int64_t n : {1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256, 512, 1024}) {
        SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, n, knee_seconds(n, 0.020, 64, 0.00025)));
        if (n <= timed_up_to)
          SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kDraft, n, knee_seconds(n, 0.004, 64, 0.00001)));
      }
    constant_overhead(&c, 0.0005);
    std::vector<int32_t> warm;
    run_steps(&c, decode_batch(1, 8, 1, 100), 0.8, 10, &warm);
    std::vector<ControllerDecision> d;
    const std::vector<ControllerRequest> batch{{100, 1, 8, 1, 200}, {0, 1, 8, 2000, 20}};
    SPECD_ASSERT_OK(c.decide(batch, &d));
    EXPECT_GT(d[0].k, 0) << "timed up to " << timed_up_to;
    EXPECT_EQ(d[1].k > 0, timed_up_to == 1024) << "timed up to " << timed_up_to;
  }
}

TEST(GoodputController, PredictedTokensAndProposerPerRequest) {
  // Proposer 0 (model-free) works for request 1 only, proposer 1 (draft model) for request 2.
  GoodputController c(GoodputControllerConfig{{false, true}, 6});
  teach(&c, 0.020, 0.00025, 0.001);  // a cheap draft: worth its forwards where it works
  const std::vector<ControllerRequest> batch{{1, 1, 6, 1, 500}, {2, 1, 6, 1, 500}};
  for (int s = 0; s < 30; ++s) {
    for (const ControllerRequest& r : batch)
      for (int32_t p = 0; p < 2; ++p) {
        const bool works = (r.id == 1) == (p == 0);
        SPECD_ASSERT_OK(c.observe(r.id, p, 4, works ? 4 : 0));
      }
  }
  std::vector<ControllerDecision> d;
  SPECD_ASSERT_OK(c.decide(batch, &d));
  EXPECT_EQ(d[0].proposer, 0);
  EXPECT_EQ(d[1].proposer, 1);
  for (const ControllerDecision& x : d) {
    EXPECT_GT(x.k, 0);
    EXPECT_GT(x.predicted_tokens, 1.0 + 0.5 * x.k);
    EXPECT_LE(x.predicted_tokens, 1.0 + x.k);
  }
}

TEST(GoodputController, ASwitchedOffRequestIsRetriedLater) {
  // Request 7's drafts all fail while request 8's succeed. Request 7 goes to k = 0; while it
  // decodes plainly its estimate fades back towards the proposer's global rate (which
  // request 8 keeps high), so it is tried again within a bounded number of steps.
  // Verified tokens cost 2 ms each (a compute-bound target), so a draft must be accepted
  // with probability ~0.4 or more to pay.
  GoodputController c(GoodputControllerConfig{{false}, 4});
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t n : {1, 2, 4, 8, 16, 32}) SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, n, 0.020 + 0.002 * n));
  for (int i = 0; i < 300; ++i) SPECD_ASSERT_OK(c.observe(9, 0, 4, 4));  // the global rate settles high
  const std::vector<ControllerRequest> batch{{7, 1, 4, 1, 100000}, {8, 1, 4, 1, 100000}};
  int off_at = -1, back_at = -1;
  for (int step = 0; step < 200 && back_at < 0; ++step) {
    std::vector<ControllerDecision> d;
    SPECD_ASSERT_OK(c.decide(batch, &d));
    if (d[0].k == 0 && off_at < 0) off_at = step;
    if (d[0].k > 0 && off_at >= 0) back_at = step;
    if (d[0].k > 0 && off_at < 0) SPECD_ASSERT_OK(c.observe(7, 0, d[0].k, 0));
    if (d[1].k > 0) SPECD_ASSERT_OK(c.observe(8, 0, d[1].k, d[1].k));
  }
  ASSERT_GE(off_at, 0) << "request 7 was never switched off";
  EXPECT_LE(off_at, 8);
  ASSERT_GT(back_at, off_at) << "request 7 was never retried";
  EXPECT_LE(back_at - off_at, 60);
}

// Model-free trees sized from the step's node probabilities: each request's budget follows
// its own candidate tree, and its calibration (realised / predicted accepted drafts, its own
// shrunk towards the proposer's) scales them.
TEST(GoodputController, NodeProbabilitiesSizeEachRequestsTree) {
  GoodputController c(unexplored_config({false}, 8));
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t n : {1, 2, 4, 8, 16, 32}) SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, n, 0.020 + 0.012 * n));
  // Plain decoding of 3 requests: 54 tokens/s, so a verified token (12 ms) must be accepted
  // with probability ~0.64 or more to pay.
  const std::vector<std::vector<double>> strong{{0.1, 0.95, 0.85, 0.9, 0.8}};  // any order
  const std::vector<std::vector<double>> weak{{0.3, 0.05}};
  const std::vector<std::vector<double>> none{{}};  // probed, no candidates
  std::vector<ControllerRequest> batch{{1, 1, 8, 1, 500}, {2, 1, 8, 1, 500}, {3, 1, 8, 1, 500}};
  batch[0].node_probs = strong;
  batch[1].node_probs = weak;
  batch[2].node_probs = none;
  std::vector<ControllerDecision> d;
  SPECD_ASSERT_OK(c.decide(batch, &d));
  EXPECT_EQ(d[0].k, 4);  // the four probable nodes, not the 0.1 one
  EXPECT_NEAR(d[0].predicted_tokens, 1 + 0.95 + 0.9 + 0.85 + 0.8, 1e-9);
  EXPECT_EQ(d[1].k, 0);
  EXPECT_EQ(d[2].k, 0);
  // The same request without node probabilities uses the acceptance estimates (prior 0.6:
  // no draft pays here), so the probabilities made the difference.
  std::vector<ControllerRequest> plain{{1, 1, 8, 1, 500}, {2, 1, 8, 1, 500}, {3, 1, 8, 1, 500}};
  SPECD_ASSERT_OK(c.decide(plain, &d));
  EXPECT_EQ(d[0].k, 0);
  // An over-confident proposer: request 1's trees (strength 3.6, the sum of its candidates'
  // probabilities) accept half of what their probabilities predict. Calibration for that
  // strength goes to 0.5, for the request and the proposer; weak trees keep theirs.
  constexpr double kStrong = 3.6, kWeak = 0.35;
  EXPECT_DOUBLE_EQ(c.estimator().tree_calibration(0, kStrong), 1.0);
  for (int i = 0; i < 300; ++i) SPECD_ASSERT_OK(c.observe_tree(1, 0, 3.5, (i % 4 < 3) ? 2 : 1));  // 1.75 of 3.5
  EXPECT_NEAR(c.estimator().tree_calibration(0, kStrong), 0.5, 0.02);
  EXPECT_NEAR(c.estimator().tree_calibration(1, 0, kStrong), 0.5, 0.02);
  EXPECT_NEAR(c.estimator().tree_calibration(2, 0, kStrong), 0.5, 0.02);  // no trees of its own: the proposer's
  EXPECT_DOUBLE_EQ(c.estimator().tree_calibration(0, kWeak), 1.0);       // another strength class
  SPECD_ASSERT_OK(c.decide(batch, &d));
  EXPECT_EQ(d[0].k, 0);  // 0.475 and below no longer pay
  // Request 2's own trees of the same strength are accepted to the end: its calibration
  // leaves the proposer's, and the same strong candidates get their four nodes for it only.
  batch[1].node_probs = strong;
  SPECD_ASSERT_OK(c.decide(batch, &d));
  EXPECT_EQ(d[1].k, 0);
  for (int i = 0; i < 10; ++i) SPECD_ASSERT_OK(c.observe_tree(2, 0, 3.5, 4));
  EXPECT_GT(c.estimator().tree_calibration(2, 0, kStrong), 1.0);
  EXPECT_LT(c.estimator().tree_calibration(0, kStrong), 0.6);
  SPECD_ASSERT_OK(c.decide(batch, &d));
  EXPECT_EQ(d[0].k, 0);
  EXPECT_EQ(d[1].k, 4);
  // A proposer no request uses fades back to its probabilities at face value (calibration 1),
  // so early over-confidence cannot switch its trees off for good.
  batch[1].node_probs = weak;
  int back = -1;
  for (int step = 0; step < 200 && back < 0; ++step) {
    SPECD_ASSERT_OK(c.decide(batch, &d));
    if (d[0].k > 0) back = step;
  }
  ASSERT_GE(back, 0) << "request 1's trees were never retried";
  EXPECT_LE(back, 100);
  EXPECT_GT(c.estimator().tree_calibration(0, kStrong), 0.64);
  // Bad input.
  const std::vector<std::vector<double>> two{{0.5}, {0.5}};  // two entries for one proposer
  batch[1].node_probs = two;
  SPECD_EXPECT_CODE(c.decide(batch, &d), kInvalidArgument);
  const std::vector<std::vector<double>> above{{1.5}};
  batch[1].node_probs = above;
  SPECD_EXPECT_CODE(c.decide(batch, &d), kInvalidArgument);
  SPECD_EXPECT_CODE(c.observe_tree(1, 0, -1.0, 0), kInvalidArgument);
  SPECD_EXPECT_CODE(c.observe_tree(1, 0, 1.0, -1), kInvalidArgument);
  SPECD_EXPECT_CODE(c.observe_tree(1, 3, 1.0, 0), kInvalidArgument);
}

// The price under a backlog (goodput_controller.h): while requests wait for admission and
// much of the engine's time goes to prefills, the tokens it emits per second of all its
// steps (G_run) fall below the decode-only step's own goodput G*, and drafts that pay at
// G_run are bought. Without a backlog G* stays the price (the running requests' latency),
// and a G_run above G* never raises it.
TEST(GoodputController, BacklogPricesTimeAtTheLongRunGoodput) {
  GoodputController c(GoodputControllerConfig{{false}, 8});
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t n : {1, 2, 4, 8, 16, 32, 64}) SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, n, 0.020 + 0.012 * n));
  // Three requests decoding plainly: G* = 3 / 0.056 s = 54 tokens/s, so a verified token
  // (12 ms) pays only if accepted with probability 0.64 or more. Candidates of 0.5 do not.
  const std::vector<std::vector<double>> half{{0.5, 0.5, 0.5, 0.5}};
  std::vector<ControllerRequest> batch{{1, 1, 8, 1, 500}, {2, 1, 8, 1, 500}, {3, 1, 8, 1, 500}};
  for (ControllerRequest& r : batch) r.node_probs = half;
  std::vector<ControllerDecision> d;
  EXPECT_EQ(c.long_run_goodput(), 0.0);
  EXPECT_DOUBLE_EQ(c.price(54.0), 54.0);
  SPECD_ASSERT_OK(c.decide(batch, &d));
  for (const ControllerDecision& x : d) EXPECT_EQ(x.k, 0);
  // Steps that also prefill: 3 tokens in 150 ms, 20 tokens/s, but nobody waits: the
  // running requests' latency prices time, still at G*.
  for (int i = 0; i < 300; ++i) SPECD_ASSERT_OK(c.observe_step(3, 0.150, 0));
  EXPECT_NEAR(c.long_run_goodput(), 20.0, 1e-6);
  EXPECT_DOUBLE_EQ(c.backlog_share(), 0.0);
  SPECD_ASSERT_OK(c.decide(batch, &d));
  for (const ControllerDecision& x : d) EXPECT_EQ(x.k, 0);
  // The same steps with requests left waiting after each: the price goes to G_run = 20, so
  // a verified token pays from probability 20 * 0.012 = 0.24 and every 0.5 is bought.
  // (No batch limit was given, so G_run is trusted at once.)
  for (int i = 0; i < 300; ++i) SPECD_ASSERT_OK(c.observe_step(3, 0.150, 5));
  EXPECT_NEAR(c.backlog_share(), 1.0, 0.01);
  EXPECT_DOUBLE_EQ(c.price(54.0), 54.0);  // the scheduler has not said that requests wait
  c.observe_load(5, 0);
  EXPECT_NEAR(c.price(54.0), 20.0, 0.5);
  SPECD_ASSERT_OK(c.decide(batch, &d));
  for (const ControllerDecision& x : d) EXPECT_EQ(x.k, 4);
  EXPECT_NEAR(c.last_typical_goodput(), 3 / 0.056, 0.5);  // the telemetry of that decision
  EXPECT_NEAR(c.last_price(), 20.0, 0.5);
  // The same price in a step with a prompt chunk (not the typical step).
  std::vector<ControllerRequest> with_prompt = batch;
  with_prompt[2].base_tokens = 20;
  SPECD_ASSERT_OK(c.decide(with_prompt, &d));
  EXPECT_EQ(d[0].k, 4);
  EXPECT_EQ(d[1].k, 4);
  // Half of the recent steps left requests waiting, and some wait now: the price is halfway.
  for (int i = 0; i < 34; ++i) SPECD_ASSERT_OK(c.observe_step(3, 0.150, 0));  // 0.98^34 = 0.5
  EXPECT_NEAR(c.backlog_share(), 0.5, 0.01);
  EXPECT_NEAR(c.price(54.0), 37.0, 0.5);
  // The queue has drained: the steps ahead serve the running requests, G* again, although
  // the share still remembers the backlog.
  c.observe_load(0, 0);
  EXPECT_DOUBLE_EQ(c.price(54.0), 54.0);
  c.observe_load(5, 0);
  // The engine emits more than the estimates predict (1000 tokens/s): the price stays G*.
  for (int i = 0; i < 2000; ++i) SPECD_ASSERT_OK(c.observe_step(100, 0.1, 5));
  EXPECT_NEAR(c.long_run_goodput(), 1000.0, 1.0);
  SPECD_ASSERT_OK(c.decide(batch, &d));
  for (const ControllerDecision& x : d) EXPECT_EQ(x.k, 0);
  // Prefill-only steps emit nothing but count as time.
  SPECD_ASSERT_OK(c.observe_step(0, 0.5, 5));
  EXPECT_LT(c.long_run_goodput(), 1000.0);
  SPECD_EXPECT_CODE(c.observe_step(-1, 0.1, 0), kInvalidArgument);
  SPECD_EXPECT_CODE(c.observe_step(1, -0.1, 0), kInvalidArgument);
  SPECD_EXPECT_CODE(c.observe_step(1, std::nan(""), 0), kInvalidArgument);
  SPECD_EXPECT_CODE(c.observe_step(1, 0.1, -2), kInvalidArgument);
  GoodputControllerConfig bad{{false}, 8};
  bad.long_run_decay = 1.0;
  // While the engine fills up (fewer requests finished than its batch limit) G_run counts
  // prefills of tokens still to come: the price stays G*.
  GoodputController filling(GoodputControllerConfig{{false}, 8});
  for (int i = 0; i < 300; ++i) SPECD_ASSERT_OK(filling.observe_step(3, 0.150, 5));
  filling.observe_load(5, 4);
  for (RequestId id = 100; id < 103; ++id) filling.forget(id, 10);
  EXPECT_DOUBLE_EQ(filling.price(54.0), 54.0);
  filling.forget(103, 10);  // the fourth: G_run now prices the backlog
  EXPECT_NEAR(filling.price(54.0), 20.0, 0.5);
  GoodputController never_forgets(bad);
  SPECD_EXPECT_CODE(never_forgets.decide(batch, &d), kInvalidArgument);
}

TEST(GoodputController, TheDraftModelIsRuledOutWhereItSlowsTheBacklog) {
  // 64 requests decode while 128 wait; each arrival brings a 200-token prompt and generates
  // 64 tokens. The target takes 2.4 ms + 10 us per token, a prompt beside the batch 2 ms.
  // A draft of 1.3 ms + 4 us per token at acceptance 0.8 pays in the decode-only step
  // (drafting k = 2 emits 156 tokens in 8.5 ms, plain 64 in 3.8 ms), and more so at the
  // backlog's low price of time (prefill-heavy steps: 64 tokens per 12 ms). But the draft
  // must also prefill every prompt it admits: with the admissions its tokens bring, plain
  // decoding serves the backlog faster (11.0 tokens per ms against about 10), so nobody
  // drafts. Without the queue it drafts; a draft 6x cheaper at acceptance 0.9 keeps
  // drafting under the backlog.
  for (const bool cheap : {false, true}) {
    for (const bool queued : {true, false}) {
      GoodputController c(unexplored_config({true}, 8));
      const double draft_base = cheap ? 0.0002 : 0.0013, draft_token = cheap ? 0.0000007 : 0.000004;
      for (int rep = 0; rep < 3; ++rep)
        for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}) {
          SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, n, 0.0024 + 0.00001 * static_cast<double>(n)));
          SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kDraft, n, draft_base + draft_token * static_cast<double>(n)));
        }
      constant_overhead(&c, 0.0008);
      std::vector<int32_t> warm;
      run_steps(&c, decode_batch(1, 8, 1, 1000), cheap ? 0.9 : 0.8, 20, &warm);  // the acceptance
      c.observe_load(queued ? 128 : 0, 64);
      std::vector<ControllerDecision> d;
      std::vector<ControllerRequest> arriving;  // the batch's prompts: what the forecast averages
      for (RequestId id = 0; id < 64; ++id) arriving.push_back(ControllerRequest{id, 200, 8, 200, 64});
      SPECD_ASSERT_OK(c.decide(arriving, &d));
      for (RequestId id = 2000; id < 2064; ++id) c.forget(id, 64);  // G_run is trusted from here
      for (int i = 0; i < 300; ++i) SPECD_ASSERT_OK(c.observe_step(64, 0.012, queued ? 128 : 0));
      SPECD_ASSERT_OK(c.decide(decode_batch(64, 8), &d));
      int drafting = 0;
      for (const ControllerDecision& x : d) drafting += x.k > 0 ? 1 : 0;
      EXPECT_EQ(drafting, cheap || !queued ? 64 : 0) << "cheap " << cheap << " queued " << queued;
    }
  }
}

TEST(GoodputController, SwitchingTheDraftOnUnderABacklogMustPayForTheCatchUps) {
  // The backlog of the test above (128 waiting, 200-token prompts, 64 tokens per request)
  // with a draft of 1 ms + 0.7 us per token at acceptance 0.9: with the admissions its
  // tokens bring it serves the backlog 4.4% faster than plain decoding (11.45 against 10.97
  // tokens per ms), which over the batch's remaining 64 x 64 tokens saves 16 ms. A batch of
  // 64 decoding requests drafts when in sync and when each request's draft is 200 tokens
  // behind (a catch-up of 12.7k tokens, 9 ms); 400 tokens behind (25.5k tokens, 18 ms) the
  // catch-ups do not pay and nobody drafts, though every request's own catch-up test (rule
  // 4) passes, as it shows without the queue. Each request is judged by its own catch-up
  // against its share of the time saved (64 tokens of the 4096).
  const auto drafting = [](bool queued, int32_t catch_up, double* price = nullptr, int in_sync = 0) {
    GoodputController c(unexplored_config({true}, 8));
    for (int rep = 0; rep < 3; ++rep)
      for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536}) {
        EXPECT_TRUE(c.observe_forward(ForwardKind::kTarget, n, 0.0024 + 0.00001 * static_cast<double>(n)).ok());
        EXPECT_TRUE(c.observe_forward(ForwardKind::kDraft, n, 0.001 + 0.0000007 * static_cast<double>(n)).ok());
      }
    constant_overhead(&c, 0.0008);
    std::vector<int32_t> warm;
    run_steps(&c, decode_batch(1, 8, 1, 1000), 0.9, 20, &warm);  // the acceptance
    c.observe_load(queued ? 128 : 0, 64);
    std::vector<ControllerDecision> d;
    std::vector<ControllerRequest> arriving;  // the batch's prompts: what the forecast averages
    for (RequestId id = 0; id < 64; ++id) arriving.push_back(ControllerRequest{id, 200, 8, 200, 64});
    EXPECT_TRUE(c.decide(arriving, &d).ok());
    for (RequestId id = 2000; id < 2064; ++id) c.forget(id, 64);  // G_run is trusted from here
    for (int i = 0; i < 300; ++i) EXPECT_TRUE(c.observe_step(64, 0.012, queued ? 128 : 0).ok());
    std::vector<ControllerRequest> batch;
    for (RequestId id = 0; id < 64; ++id) batch.push_back(ControllerRequest{id, 1, 8, id < in_sync ? 2 : catch_up, 64});
    EXPECT_TRUE(c.decide(batch, &d).ok());
    int n = 0;
    for (const ControllerDecision& x : d) n += x.k > 0 ? 1 : 0;
    if (price != nullptr) *price = c.last_price();
    return n;
  };
  double price = 0.0;
  EXPECT_EQ(drafting(true, 2, &price), 64);
  // The price of that step: G_run (64 tokens per 12 ms) marked up for the draft's admission
  // work (every request drafts: 0.14 ms of draft prefill per 200-token prompt, one per 64
  // emitted tokens).
  const double run = 64 / 0.012;
  EXPECT_NEAR(price, run / (1 - run * 0.00014 / 64), 1.0);
  EXPECT_EQ(drafting(true, 202), 64);
  EXPECT_EQ(drafting(true, 402), 0);
  EXPECT_EQ(drafting(false, 402), 64);
  // Half the batch in sync, half 400 tokens behind: the requests in sync draft, the others
  // do not catch up (each one's catch-up against its own share of the time saved).
  EXPECT_EQ(drafting(true, 402, nullptr, 32), 32);
}

TEST(GoodputController, AdmissionsArePricedAsTheEngineBatchesThem) {
  // A backlog of 128; 200-token prompts, 64 tokens per request, acceptance 0.7. The target's
  // forward is flat (2.4 ms) up to 256 tokens, then 10 us per token; the draft's 1 ms, then
  // 3 us. Prompts that were prefilled one per step (the target forwards of the steps that
  // prefilled, beyond their decoding requests, measure it) cost 0.08 ms of target time each
  // beside the 64-token batch, inside the flat part: drafting serves the backlog at 20.7
  // tokens per ms against 19.5 for plain decoding. Prefilled 16 per step (3200 tokens), each
  // costs its share of a forward far beyond the knee, 1.88 ms of target time and 0.56 ms of
  // draft time; the drafting engine admits more prompts per second of its steps, and plain
  // decoding serves the backlog faster (12.6 against 11.8).
  const auto drafting = [](int prompts_per_step) {
    GoodputController c(unexplored_config({true}, 8));
    for (int rep = 0; rep < 3; ++rep)
      for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}) {
        EXPECT_TRUE(c.observe_forward(ForwardKind::kTarget, n, knee_seconds(n, 0.0024, 256, 0.00001)).ok());
        EXPECT_TRUE(c.observe_forward(ForwardKind::kDraft, n, knee_seconds(n, 0.001, 256, 0.000003)).ok());
      }
    constant_overhead(&c, 0.0008);
    std::vector<int32_t> warm;
    run_steps(&c, decode_batch(1, 8, 1, 1000), 0.7, 20, &warm);  // the acceptance
    c.observe_load(128, 64);
    std::vector<ControllerDecision> d;
    for (RequestId first = 0; first < 64; first += prompts_per_step) {  // the prefills
      std::vector<ControllerRequest> arriving;
      for (RequestId id = first; id < first + prompts_per_step; ++id)
        arriving.push_back(ControllerRequest{id, 200, 8, 200, 64});
      EXPECT_TRUE(c.decide(arriving, &d).ok());
      const int64_t tokens = 200 * prompts_per_step;  // the step's target forward: its prefill
      EXPECT_TRUE(c.observe_forward(ForwardKind::kTarget, tokens, knee_seconds(tokens, 0.0024, 256, 0.00001)).ok());
    }
    for (RequestId id = 2000; id < 2064; ++id) c.forget(id, 64);  // G_run is trusted from here
    for (int i = 0; i < 300; ++i) EXPECT_TRUE(c.observe_step(64, 0.012, 128).ok());
    EXPECT_TRUE(c.decide(decode_batch(64, 8, 2), &d).ok());
    int n = 0;
    for (const ControllerDecision& x : d) n += x.k > 0 ? 1 : 0;
    return n;
  };
  EXPECT_EQ(drafting(1), 64);
  EXPECT_EQ(drafting(16), 0);

  // The measurement: a step's target forward beyond its decoding requests' 1 + k tokens.
  GoodputController c(unexplored_config({true}, 8));
  teach(&c, 0.0024, 0.00001, 0.001);
  std::vector<ControllerRequest> batch = decode_batch(4, 8);
  batch.push_back(ControllerRequest{7, 300, 8, 300, 64});
  std::vector<ControllerDecision> d;
  SPECD_ASSERT_OK(c.decide(batch, &d));
  int64_t decoding = d[4].k;  // the prefilling request's drafts are not prompt tokens either
  for (int i = 0; i < 4; ++i) decoding += 1 + d[static_cast<std::size_t>(i)].k;
  EXPECT_FALSE(c.load().prefill_chunk().has_value());
  SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kDraft, 400, 0.002));  // not the target's
  EXPECT_FALSE(c.load().prefill_chunk().has_value());
  SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, decoding + 300, 0.006));
  SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, 500, 0.006));  // a second forward: not the step's
  ASSERT_TRUE(c.load().prefill_chunk().has_value());
  EXPECT_DOUBLE_EQ(*c.load().prefill_chunk(), 300.0);
}

// Draft-model trees (draft_tree_width > 1) are sized after the draft grew them: the draft's
// most probable path gets the chain's gains (the learned per-depth acceptance), other nodes a
// share scaled by the draft's confidence relative to their best sibling; the nodes that pay
// at the step's price are verified, parents first; an over-confident draft's trees shrink
// as their calibration is learned.
TEST(GoodputController, SizesDraftTreesFromPerDepthAcceptance) {
  GoodputControllerConfig config = unexplored_config({true}, 8);
  config.draft_tree_width = 2;
  GoodputController c(config);
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t n : {1, 2, 4, 8, 16, 32, 64}) {
      SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, n, 0.020 + 0.012 * n));
      SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kDraft, n, 0.002 + 0.001 * n));
    }
  std::vector<ControllerDecision> d;
  SPECD_ASSERT_OK(c.decide(decode_batch(3, 8), &d));
  // Three requests, 12 ms per verified token: G* = 3 / 0.056 s, a node pays from 0.64.
  EXPECT_NEAR(c.last_price(), 3 / 0.056, 0.5);
  for (int i = 0; i < 200; ++i) SPECD_ASSERT_OK(c.observe(0, 0, 4, 4));  // request 0's trees pass to depth 4
  std::vector<double> alphas(2);
  SPECD_ASSERT_OK(c.estimator().alphas(0, 0, Span<double>(alphas)));
  ASSERT_GT(alphas[0] * alphas[1], 0.9);
  // Root children a (0.6) and b (0.3); a's children c (0.6 * 0.5) and e (0.6 * 0.25).
  // Gains: a = alpha1, c = alpha1 alpha2 (the draft's greedy path); the siblings share what
  // the top child misses: b = (1 - alpha1) 0.3 / 0.4, e = a (1 - alpha2) 0.25 / 0.5.
  const std::vector<double> probs{0.6, 0.3, 0.3, 0.15};
  const std::vector<int32_t> parents{-1, -1, 0, 0};
  std::vector<TreeSizingRequest> trees{{0, probs, parents, 4}, {1, probs, parents, 4}};
  std::vector<TreeSizing> sized;
  SPECD_ASSERT_OK(c.size_trees(trees, 0, &sized));
  EXPECT_EQ(sized[0].nodes, (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(sized[0].predicted, alphas[0] + alphas[0] * alphas[1], 1e-9);
  EXPECT_EQ(sized[1].nodes, sized[0].nodes);  // request 1 is new: the proposer's estimate
  trees[0].max_nodes = 1;  // never beyond what was reserved
  SPECD_ASSERT_OK(c.size_trees(trees, 0, &sized));
  EXPECT_EQ(sized[0].nodes, (std::vector<int32_t>{0}));
  trees[0].max_nodes = 4;
  // Verifying also costs what the step verifies anyway: beside a 40-token prompt chunk the
  // same nodes pay the same way (linear costs).
  SPECD_ASSERT_OK(c.size_trees(trees, 40, &sized));
  EXPECT_EQ(sized[0].nodes, (std::vector<int32_t>{0, 2}));
  // The trees realise a third of what they predict: their calibration falls, and so does
  // the budget.
  const double strength = alphas[0] + alphas[0] * alphas[1] + (1 - alphas[0]) * 0.75 +
                          alphas[0] * (1 - alphas[1]) * 0.5;
  for (int i = 0; i < 300; ++i) SPECD_ASSERT_OK(c.observe_tree(0, 0, 1.9, i % 3 == 0 ? 2 : 0));
  EXPECT_LT(c.estimator().tree_calibration(0, 0, strength), 0.5);
  SPECD_ASSERT_OK(c.size_trees(trees, 0, &sized));
  EXPECT_TRUE(sized[0].nodes.empty());
  // A draft whose first choice is right half of the time: its siblings carry the other
  // half, shared by the draft's confidence, and with cheap verification they pay too.
  GoodputController unsure(config);
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t n : {1, 2, 4, 8, 16, 32, 64}) {
      SPECD_ASSERT_OK(unsure.observe_forward(ForwardKind::kTarget, n, 0.020 + 0.002 * n));
      SPECD_ASSERT_OK(unsure.observe_forward(ForwardKind::kDraft, n, 0.002 + 0.001 * n));
    }
  SPECD_ASSERT_OK(unsure.decide(decode_batch(3, 8), &d));  // G* = 3 / 0.026 s: a node pays from 0.23
  for (int i = 0; i < 400; ++i) SPECD_ASSERT_OK(unsure.observe(7, 0, 1, i % 2));
  SPECD_ASSERT_OK(unsure.estimator().alphas(7, 0, Span<double>(alphas)));
  ASSERT_NEAR(alphas[0], 0.5, 0.05);
  const std::vector<TreeSizingRequest> wide{{7, probs, parents, 4}};
  SPECD_ASSERT_OK(unsure.size_trees(wide, 0, &sized));
  const double a = alphas[0], b = (1 - alphas[0]) * 0.3 / 0.4, c_ = a * alphas[1], e = a * (1 - alphas[1]) * 0.5;
  ASSERT_GT(b, 0.23);
  std::vector<int32_t> want;  // every node above the threshold, in the order of their gains
  for (auto [gain, node] : std::vector<std::pair<double, int32_t>>{{a, 0}, {b, 1}, {c_, 2}, {e, 3}})
    if (gain > 0.23) want.push_back(node);
  std::sort(want.begin(), want.end(), [&](int32_t x, int32_t y) {
    const double gx[] = {a, b, c_, e};
    return gx[x] > gx[y];
  });
  EXPECT_EQ(sized[0].nodes, want);
  EXPECT_GE(want.size(), 2u);
  // Bad input.
  const std::vector<int32_t> child_first{1, -1, 0, 0};
  trees[1].parents = child_first;
  SPECD_EXPECT_CODE(c.size_trees(trees, 0, &sized), kInvalidArgument);
  const std::vector<double> above_one{0.6, 1.5, 0.3, 0.15};
  trees[1] = TreeSizingRequest{1, above_one, parents, 4};
  SPECD_EXPECT_CODE(c.size_trees(trees, 0, &sized), kInvalidArgument);
  const std::vector<int32_t> short_parents{-1};
  trees[1] = TreeSizingRequest{1, probs, short_parents, 4};
  SPECD_EXPECT_CODE(c.size_trees(trees, 0, &sized), kInvalidArgument);
  SPECD_EXPECT_CODE(c.size_trees({}, -1, &sized), kInvalidArgument);
  GoodputController model_free(GoodputControllerConfig{{false}, 8});
  SPECD_EXPECT_CODE(model_free.size_trees({}, 0, &sized), kInvalidArgument);
}

// A draft forward costing 0.7 of a target step (the ratio measured on an H100 for the real
// pair's shapes): at the prior 0.6, k = 1 looks like a loss ((1 + 0.6) / 1.7 < 1), so without
// exploration the draft is never tried. With it, drafting is tried first and then kept where
// its measured acceptance (0.9) pays, or dropped where it does not (0.1): a request whose own
// drafts fail stops at once, drifts back to the still-optimistic global estimate while idle
// and tries again, until the proposer's ten depth-1 trials let the data decide; after that
// it is retried only after 16, then 32 idle steps. No exploration while requests wait for
// admission.
TEST(GoodputController, TriesAnExpensiveDraftBeforeJudgingIt) {
  auto teach_ratio = [](GoodputController* c) {
    for (int rep = 0; rep < 3; ++rep)
      for (int64_t n : {1, 2, 4, 8, 16, 32, 64}) {
        SPECD_ASSERT_OK(c->observe_forward(ForwardKind::kTarget, n, 0.010));
        SPECD_ASSERT_OK(c->observe_forward(ForwardKind::kDraft, n, 0.007));
      }
    constant_overhead(c, 0.0002);
  };
  std::vector<ControllerDecision> d;
  GoodputController prior_only(unexplored_config({true}, 8));
  teach_ratio(&prior_only);
  SPECD_ASSERT_OK(prior_only.decide(decode_batch(1, 8), &d));
  EXPECT_EQ(d[0].k, 0);  // judged by the prior alone: never tried

  GoodputController backlogged(GoodputControllerConfig{{true}, 8});
  teach_ratio(&backlogged);
  backlogged.observe_load(5, 64);  // requests wait for admission: no exploration in this step
  SPECD_ASSERT_OK(backlogged.decide(decode_batch(1, 8), &d));
  EXPECT_EQ(d[0].k, 0);
  backlogged.observe_load(0, 64);
  SPECD_ASSERT_OK(backlogged.decide(decode_batch(1, 8), &d));
  EXPECT_GE(d[0].k, 1);

  for (const double alpha : {0.9, 0.1}) {
    GoodputController c(GoodputControllerConfig{{true}, 8});
    teach_ratio(&c);
    std::vector<int32_t> ks;
    run_steps(&c, decode_batch(2, 8, 1, 0), alpha, 60, &ks);
    std::string seen;
    for (int32_t k : ks) seen += std::to_string(k) + " ";
    EXPECT_GE(ks[0], 1) << alpha << ": " << seen;  // tried at once
    EXPECT_TRUE(c.estimator().explored(0)) << alpha << ": " << seen << " alpha1 " << c.estimator().global_alpha(0, 1);
    if (alpha > 0.5) {
      EXPECT_GE(ks.back(), 1) << "a good expensive draft is kept";
    } else {  // dropped once measured, retried after 16 idle steps, then after 32 (estimator rules)
      const std::vector<int32_t> last(ks.end() - 40, ks.end());  // the last 20 steps of 2 requests
      EXPECT_LE(std::count_if(last.begin(), last.end(), [](int32_t k) { return k > 0; }), 2) << seen;
      EXPECT_EQ(std::vector<int32_t>(ks.end() - 10, ks.end()), std::vector<int32_t>(10, 0)) << seen;
    }
  }
}

// An unlucky exploration (the first verifications fail; later ones would be accepted at 0.9)
// stops drafting, and fading alone would only bring depth 1 back to the prior 0.6, below what
// this draft needs: the retry after 16 idle steps measures the proposer again, and drafting
// resumes for good.
TEST(GoodputController, AnUnluckyExplorationIsRetried) {
  GoodputController c(GoodputControllerConfig{{true}, 8});
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t n : {1, 2, 4, 8, 16, 32, 64}) {
      SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, n, 0.010));
      SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kDraft, n, 0.007));
    }
  constant_overhead(&c, 0.0002);
  std::vector<int32_t> ks;
  for (int s = 0; s < 100 && !c.estimator().explored(0); ++s)
    run_steps(&c, decode_batch(8, 8, 1, 0), 0.3, 1, &ks);  // exploration: 3 in 10 accepted
  ASSERT_TRUE(c.estimator().explored(0));
  ks.clear();
  run_steps(&c, decode_batch(8, 8, 1, 0), 0.9, 40, &ks);  // 8 requests: ks has 8 entries per step
  std::string seen;
  for (int32_t k : ks) seen += std::to_string(k) + " ";
  const auto first = std::find_if(ks.begin(), ks.end(), [](int32_t k) { return k > 0; }) - ks.begin();
  EXPECT_GE(first / 8, 10) << seen;  // the data first say no
  EXPECT_LE(first / 8, 17) << seen;  // the retry comes after 16 idle steps
  EXPECT_EQ(std::count(ks.end() - 8 * 20, ks.end(), 0), 0) << seen;  // then drafting pays and stays
}

// Exploration is for the trials it needs: in a step without a queue, only the first
// exploration_trials (10) requests of a large batch explore an untried draft; the others are
// priced on the data (with these per-token costs a draft token at the prior 0.6 costs more
// time than it yields at this batch, at the exploring estimate 1 it pays).
TEST(GoodputController, OnlyTenRequestsOfABatchExplore) {
  GoodputController c(GoodputControllerConfig{{true}, 8});
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 128}) {
      SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, n, 0.010 + 0.00025 * static_cast<double>(n)));
      SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kDraft, n, 0.001 + 0.0001 * static_cast<double>(n)));
    }
  constant_overhead(&c, 0.0002);
  std::vector<ControllerDecision> d;
  SPECD_ASSERT_OK(c.decide(decode_batch(30, 8), &d));
  for (std::size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d[i].k > 0, i < 10) << i;
  SPECD_ASSERT_OK(c.decide(decode_batch(6, 8), &d));  // a small batch: all of it
  for (const ControllerDecision& x : d) EXPECT_GT(x.k, 0);
}

TEST(GoodputController, AnUntimedDraftDraftsTwoTokens) {
  // A flat (memory-bound) target is measured; the draft never ran. Priced at nothing it would
  // buy the deepest chain on a guess (k = 8 for the first requests of a load sweep on H100
  // costs, with their catch-ups: 31 ms of draft time before anything was known). The header's
  // rule: two tokens until the draft is timed at two sizes (its catch-up forward and a
  // one-token one); before any timing free while exploring, at the target's cost under a
  // backlog.
  auto fresh = [] {
    auto c = std::make_unique<GoodputController>(GoodputControllerConfig{{true}, 8});
    for (int rep = 0; rep < 3; ++rep)
      for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 128})
        EXPECT_TRUE(c->observe_forward(ForwardKind::kTarget, n, knee_seconds(n, 0.020, 64, 0.00025)).ok());
    constant_overhead(c.get(), 0.0005);
    return c;
  };
  std::vector<ControllerDecision> d;
  auto backlogged = fresh();
  backlogged->observe_load(5, 64);
  SPECD_ASSERT_OK(backlogged->decide(decode_batch(1, 8), &d));
  EXPECT_EQ(d[0].k, 0);  // a draft as dear as the target does not pay at the prior

  auto c = fresh();
  SPECD_ASSERT_OK(c->decide(decode_batch(1, 8), &d));
  EXPECT_EQ(d[0].k, 2);
  EXPECT_EQ(c->draft_costs().has_data(), false);
  SPECD_ASSERT_OK(c->observe_forward(ForwardKind::kDraft, 1, 0.002));  // one size: still a guess
  SPECD_ASSERT_OK(c->observe(0, 0, 2, 2));
  SPECD_ASSERT_OK(c->decide(decode_batch(1, 8), &d));
  EXPECT_EQ(d[0].k, 2);
  SPECD_ASSERT_OK(c->observe_forward(ForwardKind::kDraft, 4, 0.002));  // two sizes: a cheap draft
  SPECD_ASSERT_OK(c->observe(0, 0, 2, 2));
  SPECD_ASSERT_OK(c->decide(decode_batch(1, 8), &d));
  EXPECT_GT(d[0].k, 2);
}

TEST(GoodputController, TheTypicalStepFeedsTheDraftTwoTokensPerRequest) {
  // After a step whose drafts were all accepted the draft processes its own last draft and
  // the bonus token, so the typical step (header, rule 3) prices a drafting request's first
  // draft forward at 2 tokens: G* = E / (target(8) + draft(8) + overhead) for 4 requests
  // drafting one token each, not draft(4).
  GoodputController c(GoodputControllerConfig{{true}, 1});
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t n : {1, 2, 4, 8, 16, 32, 64}) {
      SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kTarget, n, 0.003));
      SPECD_ASSERT_OK(c.observe_forward(ForwardKind::kDraft, n, 0.001 + 0.0001 * static_cast<double>(n)));
    }
  constant_overhead(&c, 0.0005);
  std::vector<ControllerDecision> d;
  SPECD_ASSERT_OK(c.decide(decode_batch(4, 1), &d));
  double expected = 0;
  for (const ControllerDecision& x : d) {
    EXPECT_EQ(x.k, 1);
    expected += x.predicted_tokens;
  }
  EXPECT_NEAR(c.last_typical_goodput(), expected / (0.003 + 0.0018 + 0.0005), 1e-6 * expected / 0.0053);
}

TEST(GoodputController, ColdStartAndBadInput) {
  GoodputController c(GoodputControllerConfig{{true}, 8});
  std::vector<ControllerDecision> d;
  SPECD_ASSERT_OK(c.decide(decode_batch(3, 8), &d));  // no costs yet: plain decoding
  for (const ControllerDecision& x : d) EXPECT_EQ(x.k, 0);
  SPECD_EXPECT_CODE(c.decide(std::vector<ControllerRequest>{{1, 0, 8, 1, 10}}, &d), kInvalidArgument);
  SPECD_EXPECT_CODE(c.observe(1, 5, 2, 1), kInvalidArgument);  // no proposer 5
  SPECD_EXPECT_CODE(c.observe_forward(ForwardKind::kTarget, 4, -1.0), kInvalidArgument);
  GoodputController two_drafts(GoodputControllerConfig{{true, true}, 8});
  SPECD_EXPECT_CODE(two_drafts.decide(decode_batch(1, 8), &d), kInvalidArgument);
  GoodputController none(GoodputControllerConfig{{}, 8});
  SPECD_EXPECT_CODE(none.decide(decode_batch(1, 8), &d), kInvalidArgument);
}

}  // namespace
}  // namespace specd
