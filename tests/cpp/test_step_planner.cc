// StepPlanner: the scheduler's rules (step_planner.h) on a real BlockManager, without models:
// chunked prefill fused with the first verify, admission order and limits, node budgets of
// chains and trees, k caps, proposals shrunk to the budget, preemption of the newest request
// (never an older one), and bad input.
#include <gtest/gtest.h>

#include <vector>

#include "block_manager_test_util.h"
#include "specd/step_planner.h"

namespace specd::testing {
namespace {

// A request the test drives: what the engine would tell the planner, and commit after a step.
struct Req {
  RequestId id;
  int64_t length, computed_t = 0, computed_d = 0, room = 100;
};

Status sync(StepPlanner& p, const std::vector<Req>& reqs) {
  std::vector<SequenceState> states;
  for (const Req& r : reqs) states.push_back(SequenceState{r.id, r.length, r.computed_t, r.computed_d, r.room});
  return p.sync(states);
}

// Commits a planned item as an engine step would if every draft were rejected (plain tokens).
void commit(BlockManager& bm, const WorkPlan& w, Req* r) {
  ASSERT_TRUE(bm.commit(w.id, 0, w.num_prefix + (w.decide ? 1 : 0)).ok());
  r->computed_t += w.num_prefix + (w.decide ? 1 : 0);
  if (w.decide) ++r->length;  // the bonus token
  if (!w.draft_slots.empty()) {
    ASSERT_TRUE(bm.commit(w.id, 1, w.draft_catch_up).ok());
    r->computed_d += w.draft_catch_up;
  }
}

TEST(StepPlanner, ChunkedPrefillThenVerifyFusedWithItsEnd) {
  auto bm = make_manager(64);
  StepPlanner p(bm.get(), StepPlannerConfig{4, 5, false, 4});
  std::vector<Req> r{{1, 11}};
  SPECD_ASSERT_OK(p.add(1));
  std::vector<int32_t> prefixes;
  for (int step = 0; step < 3; ++step) {
    SPECD_ASSERT_OK(sync(p, r));
    EXPECT_EQ(p.candidates(), (std::vector<RequestId>{1}));
    StepPlan plan;
    SPECD_ASSERT_OK(p.plan({}, &plan));
    ASSERT_EQ(plan.items.size(), 1u);
    const WorkPlan& w = plan.items[0];
    EXPECT_EQ(static_cast<int32_t>(w.target_slots.size()), w.num_tokens());
    prefixes.push_back(w.num_prefix);
    if (step < 2) EXPECT_FALSE(w.decide);
    commit(*bm, w, &r[0]);
    if (step == 2) EXPECT_TRUE(w.decide && w.k == 0 && w.nodes == 0);
  }
  // 10 prefix tokens in a budget of 5: 5, 5, then the root alone (no prefix left).
  EXPECT_EQ(prefixes, (std::vector<int32_t>{5, 5, 0}));
}

TEST(StepPlanner, AdmissionOrderLimitsAndNodeBudgets) {
  auto bm = make_manager(256, 4, {6, 3});  // target and draft in one pool
  StepPlannerConfig config{2, 64, true, 6, 5, 3, -1};  // 2 sequences; n-gram trees of 5 nodes; draft trees of width 3
  StepPlanner p(bm.get(), config);
  std::vector<Req> r{{10, 8}, {11, 8}, {12, 8}};
  for (const Req& x : r) SPECD_ASSERT_OK(p.add(x.id));
  SPECD_ASSERT_OK(sync(p, r));
  EXPECT_EQ(p.candidates(), (std::vector<RequestId>{10, 11}));  // the batch limit: the oldest two
  StepPlan plan;
  // k 4 with the draft model (a tree of 4 * 3 nodes), k 9 with n-gram (capped at k_max 6: 5 nodes).
  const std::vector<PlannedDecision> d{{10, 4, ProposalKind::kDraftModel}, {11, 9, ProposalKind::kModelFree}};
  SPECD_ASSERT_OK(p.plan(d, &plan));
  ASSERT_EQ(plan.items.size(), 2u);
  EXPECT_EQ(plan.admitted, (std::vector<RequestId>{10, 11}));
  const WorkPlan &a = plan.items[0], &b = plan.items[1];
  EXPECT_TRUE(a.decide && a.fits);
  EXPECT_EQ(a.k, 4);
  EXPECT_EQ(a.nodes, 12);
  EXPECT_EQ(a.num_prefix, 7);
  EXPECT_EQ(a.target_slots.size(), 7u + 1 + 12);
  EXPECT_EQ(a.draft_catch_up, 8);  // the whole prompt: the draft has seen nothing
  EXPECT_EQ(a.draft_slots.size(), 8u + 3 * 3);  // catch-up + (k - 1) * width fed nodes
  EXPECT_EQ(p.draft_fed(4), 9);
  EXPECT_EQ(b.k, 6);
  EXPECT_EQ(b.nodes, 5);
  EXPECT_TRUE(b.draft_slots.empty());
  EXPECT_EQ(p.running(), (std::vector<RequestId>{10, 11}));
  EXPECT_EQ(p.waiting().size(), 1u);
  commit(*bm, a, &r[0]);
  commit(*bm, b, &r[1]);
  // Request 11 finishes: 12 is admitted next step; room caps its k at room - 1.
  SPECD_ASSERT_OK(p.finish(11));
  r.erase(r.begin() + 1);
  r[1].room = 3;
  SPECD_ASSERT_OK(sync(p, r));
  EXPECT_EQ(p.candidates(), (std::vector<RequestId>{10, 12}));
  SPECD_ASSERT_OK(p.plan(std::vector<PlannedDecision>{{12, 8, ProposalKind::kDraftModel}}, &plan));
  ASSERT_EQ(plan.items.size(), 2u);
  EXPECT_EQ(plan.items[0].k, 0);  // no decision for 10: plain decoding
  EXPECT_EQ(plan.items[1].k, 2);  // room 3: at most 2 drafts (+ the bonus token)
  EXPECT_EQ(plan.items[1].nodes, 6);
}

TEST(StepPlanner, AProposalShrinksToTheBudget) {
  auto bm = make_manager(64);
  StepPlanner p(bm.get(), StepPlannerConfig{4, 4, false, 8});
  std::vector<Req> r{{1, 5}};
  SPECD_ASSERT_OK(p.add(1));
  StepPlan plan;
  SPECD_ASSERT_OK(sync(p, r));
  SPECD_ASSERT_OK(p.plan(std::vector<PlannedDecision>{{1, 8, ProposalKind::kModelFree}}, &plan));
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_FALSE(plan.items[0].decide);  // 4 prefix tokens fill the budget of 4
  commit(*bm, plan.items[0], &r[0]);
  SPECD_ASSERT_OK(sync(p, r));
  SPECD_ASSERT_OK(p.plan(std::vector<PlannedDecision>{{1, 8, ProposalKind::kModelFree}}, &plan));
  const WorkPlan& w = plan.items[0];
  EXPECT_TRUE(w.decide);
  EXPECT_FALSE(w.fits);
  EXPECT_EQ(w.nodes, 3);  // the root and 3 nodes fill the budget of 4
  EXPECT_EQ(w.k, 3);
}

TEST(StepPlanner, PreemptsTheNewestRequestNeverAnOlderOne) {
  auto bm = make_manager(6);  // 6 pages of 4 tokens
  StepPlanner p(bm.get(), StepPlannerConfig{4, 64, false, 0});
  std::vector<Req> r{{1, 3}, {2, 3}, {3, 3}};
  for (const Req& x : r) SPECD_ASSERT_OK(p.add(x.id));
  for (int step = 0; step < 12; ++step) {
    SPECD_ASSERT_OK(sync(p, r));
    StepPlan plan;
    SPECD_ASSERT_OK(p.plan({}, &plan));
    for (RequestId id : plan.preempted) {
      EXPECT_NE(id, 1) << "the oldest request was preempted";
      for (Req& x : r)
        if (x.id == id) x.computed_t = x.computed_d = 0;
    }
    for (const WorkPlan& w : plan.items)
      for (Req& x : r)
        if (x.id == w.id) commit(*bm, w, &x);
    ASSERT_TRUE(bm->check_invariants().ok());
    if (!plan.preempted.empty()) {
      EXPECT_EQ(p.waiting().front(), plan.preempted.back());  // back at the front of the queue
      SUCCEED();
      return;
    }
  }
  FAIL() << "three growing requests in 24 slots were never preempted";
}

// Prefix caching: a request drives the planner with its tokens (tokens[0, length) are its
// tokens; the ones past `sent` go with the next sync).
struct TokenReq {
  Req r;
  std::vector<int32_t> tokens;
  std::size_t sent = 0;
};

Status sync_tokens(StepPlanner& p, std::vector<TokenReq*> reqs) {
  std::vector<SequenceState> states;
  for (TokenReq* t : reqs) {
    const auto length = static_cast<std::size_t>(t->r.length);
    states.push_back(SequenceState{t->r.id, t->r.length, t->r.computed_t, t->r.computed_d, t->r.room,
                                   Span<const int32_t>(t->tokens.data() + t->sent, length - t->sent)});
    t->sent = length;
  }
  return p.sync(states);
}

std::vector<int32_t> tokens_from(int32_t first, int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(first + i);
  return t;
}

// Runs steps (all requests plain or with the draft model at k 2) until `until` holds.
template <class Until>
void run_steps(BlockManager& bm, StepPlanner& p, std::vector<TokenReq*> reqs, ProposalKind kind, Until until) {
  for (int step = 0; step < 64 && !until(); ++step) {
    SPECD_ASSERT_OK(sync_tokens(p, reqs));
    std::vector<PlannedDecision> d;
    for (TokenReq* t : reqs) d.push_back({t->r.id, kind == ProposalKind::kNone ? 0 : 2, kind});
    StepPlan plan;
    SPECD_ASSERT_OK(p.plan(d, &plan));
    for (const WorkPlan& w : plan.items)
      for (TokenReq* t : reqs)
        if (t->r.id == w.id) {
          t->r.computed_t += w.cached_target;
          t->r.computed_d += w.cached_draft;
          commit(bm, w, &t->r);
        }
    SPECD_ASSERT_OK(bm.check_invariants());
  }
  ASSERT_TRUE(until());
}

TEST(StepPlanner, AdmissionAdoptsTheCachedPrefixForTargetAndDraft) {
  auto bm = make_manager(64, 4, {6, 3}, 1, true);  // target blocks of 4 tokens, draft blocks of 8
  StepPlanner p(bm.get(), StepPlannerConfig{4, 64, true, 4});
  TokenReq a{{1, 20}, tokens_from(100, 64)};
  SPECD_ASSERT_OK(p.add(1));
  run_steps(*bm, p, {&a}, ProposalKind::kDraftModel, [&] { return a.r.computed_d >= 20; });
  // a's committed blocks are registered at the next sync; b shares its first 18 tokens.
  TokenReq b{{2, 25}, tokens_from(100, 64)};
  b.tokens[18] = 7;
  SPECD_ASSERT_OK(p.add(2));
  SPECD_ASSERT_OK(sync_tokens(p, {&a, &b}));
  // Before admission, cached_prefix says what it will adopt (a running request: nothing).
  int64_t cached_t = -1, cached_d = -1;
  SPECD_ASSERT_OK(p.cached_prefix(2, &cached_t, &cached_d));
  EXPECT_EQ(cached_t, 16);
  EXPECT_EQ(cached_d, 16);
  SPECD_ASSERT_OK(p.cached_prefix(1, &cached_t, &cached_d));
  EXPECT_EQ(cached_t + cached_d, 0);
  SPECD_EXPECT_CODE(p.cached_prefix(99, &cached_t, &cached_d), kNotFound);
  // The policy's view: b's 25 tokens less the 16 it adopts; a's length less its KV.
  int64_t base = -1, catch_up = -1;
  SPECD_ASSERT_OK(p.candidate_work(2, &base, &catch_up));
  EXPECT_EQ(base, 25 - 16);
  EXPECT_EQ(catch_up, 25 - 16);
  SPECD_ASSERT_OK(p.candidate_work(1, &base, &catch_up));
  EXPECT_EQ(base, a.r.length - a.r.computed_t);
  EXPECT_EQ(catch_up, a.r.length - a.r.computed_d);
  SPECD_EXPECT_CODE(p.candidate_work(99, &base, &catch_up), kNotFound);
  StepPlan plan;
  SPECD_ASSERT_OK(p.plan(std::vector<PlannedDecision>{{2, 2, ProposalKind::kDraftModel}}, &plan));
  ASSERT_EQ(plan.admitted, (std::vector<RequestId>{2}));
  const WorkPlan& w = plan.items.back();
  EXPECT_EQ(w.cached_target, 16);  // four target blocks of the 18 shared tokens
  EXPECT_EQ(w.cached_draft, 16);   // two draft blocks
  EXPECT_EQ(w.num_prefix, 25 - 1 - 16);
  EXPECT_EQ(w.draft_catch_up, 25 - 16);
  EXPECT_EQ(info_of(*bm, 2, 0).committed + info_of(*bm, 2, 0).reserved, 16 + w.num_tokens());
  EXPECT_EQ(pages_of(*bm, 2)[0], pages_of(*bm, 1)[0]);
  EXPECT_EQ(p.prefix_hit_stats().hit_tokens, 16);
  EXPECT_EQ(p.prefix_hit_stats().query_tokens, 20 + 25);
  EXPECT_EQ(p.prefix_hit_stats().admissions, 2);
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(StepPlanner, PrefixCacheOptOutPreemptionAndFinish) {
  auto bm = make_manager(64, 4, {6}, 1, true);
  StepPlanner p(bm.get(), StepPlannerConfig{4, 64, false, 0});
  TokenReq a{{1, 13}, tokens_from(0, 64)};
  SPECD_ASSERT_OK(p.add(1));
  run_steps(*bm, p, {&a}, ProposalKind::kNone, [&] { return a.r.length >= 15; });
  // finish registers the last full blocks with the tokens since the last sync.
  const auto before = bm->prefix_cache_stats().cached_pages;
  const std::vector<int32_t> tail(a.tokens.begin() + static_cast<std::ptrdiff_t>(a.sent),
                                  a.tokens.begin() + a.r.length);
  SPECD_ASSERT_OK(p.finish(1, tail));
  EXPECT_EQ(bm->prefix_cache_stats().cached_pages, a.r.computed_t / 4);
  EXPECT_GE(bm->prefix_cache_stats().cached_pages, before);
  // Opted out: adopts nothing.
  TokenReq b{{2, 14}, tokens_from(0, 64)};
  SPECD_ASSERT_OK(p.add(2, /*use_prefix_cache=*/false));
  SPECD_ASSERT_OK(sync_tokens(p, {&b}));
  int64_t cached_t = -1, cached_d = -1;
  SPECD_ASSERT_OK(p.cached_prefix(2, &cached_t, &cached_d));
  EXPECT_EQ(cached_t, 0);  // opted out
  int64_t base = -1, catch_up = -1;
  SPECD_ASSERT_OK(p.candidate_work(2, &base, &catch_up));
  EXPECT_EQ(base, 14);  // its whole prompt
  StepPlan plan;
  SPECD_ASSERT_OK(p.plan({}, &plan));
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].cached_target, 0);
  EXPECT_EQ(plan.items[0].num_prefix, 13);
  commit(*bm, plan.items[0], &b.r);
  // The same tokens in a request that looks up: adopts 12 of its 13 prefix tokens.
  TokenReq c{{3, 14}, tokens_from(0, 64)};
  SPECD_ASSERT_OK(p.add(3));
  SPECD_ASSERT_OK(sync_tokens(p, {&b, &c}));
  SPECD_ASSERT_OK(p.plan({}, &plan));
  ASSERT_EQ(plan.admitted, (std::vector<RequestId>{3}));
  EXPECT_EQ(plan.items.back().cached_target, 12);
  EXPECT_EQ(plan.items.back().num_prefix, 1);
}

TEST(StepPlanner, APreemptedRequestReadoptsItsOwnBlocks) {
  auto bm = make_manager(8, 4, {6}, 1, true);  // 8 pages of 4 tokens
  StepPlanner p(bm.get(), StepPlannerConfig{4, 64, false, 0});
  TokenReq a{{1, 9}, tokens_from(0, 64)}, b{{2, 9}, tokens_from(500, 64)};
  SPECD_ASSERT_OK(p.add(1));
  SPECD_ASSERT_OK(p.add(2));
  bool preempted = false;
  for (int step = 0; step < 40 && !preempted; ++step) {
    SPECD_ASSERT_OK(sync_tokens(p, {&a, &b}));
    StepPlan plan;
    SPECD_ASSERT_OK(p.plan({}, &plan));
    for (const WorkPlan& w : plan.items) commit(*bm, w, w.id == 1 ? &a.r : &b.r);
    if (!plan.preempted.empty()) {
      ASSERT_EQ(plan.preempted, (std::vector<RequestId>{2}));
      b.r.computed_t = 0;
      preempted = true;
    }
  }
  ASSERT_TRUE(preempted);
  const int64_t full = b.r.length / 4;  // b's registered blocks are evictable now
  SPECD_ASSERT_OK(p.finish(1));         // room for b again
  SPECD_ASSERT_OK(sync_tokens(p, {&b}));
  StepPlan plan;
  SPECD_ASSERT_OK(p.plan({}, &plan));
  ASSERT_EQ(plan.admitted, (std::vector<RequestId>{2}));
  EXPECT_GT(plan.items[0].cached_target, 0);
  EXPECT_LE(plan.items[0].cached_target, full * 4);
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(StepPlanner, BadInput) {
  auto bm = make_manager(16);
  StepPlanner p(bm.get(), StepPlannerConfig{2, 16, false, 4});
  SPECD_ASSERT_OK(p.add(1));
  SPECD_EXPECT_CODE(p.add(1), kAlreadyExists);
  SPECD_EXPECT_CODE(p.finish(7), kNotFound);
  SPECD_EXPECT_CODE(sync(p, {{7, 3}}), kNotFound);
  SPECD_EXPECT_CODE(sync(p, {{1, 3, 3}}), kInvalidArgument);  // computed past the last token
  SPECD_EXPECT_CODE(sync(p, {{1, 0}}), kInvalidArgument);
  StepPlan plan;
  SPECD_ASSERT_OK(sync(p, {{1, 3}}));
  SPECD_EXPECT_CODE(p.plan(std::vector<PlannedDecision>{{1, -1, ProposalKind::kNone}}, &plan), kInvalidArgument);
  StepPlanner bad(bm.get(), StepPlannerConfig{0, 16, false, 4});
  SPECD_EXPECT_CODE(bad.add(1), kInvalidArgument);
  StepPlanner no_draft(bm.get(), StepPlannerConfig{2, 16, true, 4});  // the pool has no draft model
  SPECD_EXPECT_CODE(no_draft.plan({}, &plan), kInvalidArgument);
  SPECD_ASSERT_OK(p.finish(1));
  EXPECT_FALSE(p.has_work());
  // Prefix caching: new_tokens must continue the tokens the planner holds.
  auto cached = make_manager(16, 4, {6}, 1, true);
  StepPlanner q(cached.get(), StepPlannerConfig{2, 16, false, 4});
  SPECD_ASSERT_OK(q.add(1));
  const std::vector<int32_t> three{1, 2, 3};
  SPECD_EXPECT_CODE(q.sync(std::vector<SequenceState>{{1, 5, 0, 0, 10, three}}), kInvalidArgument);
  SPECD_ASSERT_OK(q.sync(std::vector<SequenceState>{{1, 3, 0, 0, 10, three}}));
  SPECD_ASSERT_OK(q.sync(std::vector<SequenceState>{{1, 4, 0, 0, 10, Span<const int32_t>(three.data(), 1)}}));
}

}  // namespace
}  // namespace specd::testing
