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
}

}  // namespace
}  // namespace specd::testing
