// Embedding specd's C++ core in a server: the engine's scheduling and speculation decisions
// without Python, around a simulated model.
//
// Requests share one KV page pool for a target and a draft model (BlockManager). Each step
// the StepPlanner (step_planner.h) lists the requests to decide for, the GoodputController
// (goodput_controller.h) picks k per request from acceptance and costs it learns online, and
// the planner plans the step: prefill chunks, verify items, reserved target and draft slots,
// preemption of the newest request when the pool runs out. The "models" are simulated: a
// step takes a synthetic memory-bound time, and each draft is accepted with a probability
// that differs per request. The server commits what was accepted, exactly as the Python
// engine does, and feeds the controller back. Prefix caching is on: every prompt starts with
// the same 64-token system prompt, the server hands the planner each request's new tokens at
// every sync, and a request admitted once that prompt's blocks are cached adopts them
// (WorkPlan::cached_target / cached_draft become its computed KV) instead of prefilling them.
// The program checks the manager's invariants every step and exits non-zero on any
// unexpected status.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

#include "specd/block_manager.h"
#include "specd/goodput_controller.h"
#include "specd/step_planner.h"

namespace {

constexpr specd::ModelIndex kTarget = 0;
constexpr specd::ModelIndex kDraft = 1;

struct Request {
  specd::RequestId id;
  std::vector<int32_t> tokens;    // prompt + generated tokens
  int64_t computed_t = 0, computed_d = 0;
  int64_t generated = 0, max_new = 0;
  double alpha = 0.0;             // the simulated chance that each draft is accepted
  int64_t synced = 0;             // tokens the planner has (prefix caching: sync's new_tokens)

  int64_t length() const { return static_cast<int64_t>(tokens.size()); }
  specd::Span<const int32_t> new_tokens() const {
    return {tokens.data() + synced, tokens.size() - static_cast<std::size_t>(synced)};
  }
};

bool fail(const specd::Status& s, const char* where) {
  std::fprintf(stderr, "unexpected status in %s: %s\n", where, s.to_string().c_str());
  return false;
}

// A memory-bound GPU: flat to 64 tokens, then linear.
double forward_seconds(int64_t tokens, double base) { return base + 0.00025 * std::max<int64_t>(0, tokens - 64); }

}  // namespace

int main() {
  // Qwen2.5-Coder-1.5B (28 layers, 2 KV heads x 128, bf16) and -0.5B (24 layers, 2 x 64).
  specd::BlockManagerConfig config;
  config.page_bytes = 16 * 28672;  // 16 target tokens per page
  config.num_pages = 96;
  config.models = {{"target", 28672}, {"draft", 12288}};
  config.prefix_caching = true;
  std::unique_ptr<specd::BlockManager> bm;
  if (auto s = specd::BlockManager::create(config, &bm); !s.ok()) return fail(s, "create"), 1;

  const int32_t k_max = 6;
  specd::StepPlanner planner(bm.get(), specd::StepPlannerConfig{8, 256, true, k_max});
  specd::GoodputController controller(specd::GoodputControllerConfig{{true}, k_max});

  std::mt19937 rng(2024);
  std::uniform_int_distribution<int32_t> token(1, 151935);
  std::vector<int32_t> system_prompt(64);
  for (int32_t& t : system_prompt) t = token(rng);
  std::unordered_map<specd::RequestId, Request> requests;
  int64_t prompt_tokens = 0;
  for (specd::RequestId id = 0; id < 16; ++id) {
    Request r{id, system_prompt};
    r.tokens.resize(system_prompt.size() + 8 + rng() % 90);
    for (std::size_t i = system_prompt.size(); i < r.tokens.size(); ++i) r.tokens[i] = token(rng);
    r.max_new = 60 + static_cast<int64_t>(rng() % 100);
    r.alpha = id % 2 == 0 ? 0.85 : 0.2;
    prompt_tokens += r.length();
    requests.emplace(id, std::move(r));
    if (auto s = planner.add(id); !s.ok()) return fail(s, "add"), 1;
  }
  int64_t steps = 0, preemptions = 0, tokens = 0, speculated = 0, decided = 0, finished = 0;
  int64_t drafted[2] = {0, 0}, verifies[2] = {0, 0};  // [poor, good drafts]: draft tokens, verify steps

  while (planner.has_work()) {
    std::vector<specd::SequenceState> states;
    for (const auto& [id, r] : requests)
      states.push_back(specd::SequenceState{id, r.length(), r.computed_t, r.computed_d, r.max_new - r.generated,
                                            r.new_tokens()});
    if (auto s = planner.sync(states); !s.ok()) return fail(s, "sync"), 1;
    for (auto& [id, r] : requests) r.synced = r.length();

    // Decide k for the running requests and the ones the step may admit.
    std::vector<specd::ControllerRequest> batch;
    for (specd::RequestId id : planner.candidates()) {
      const Request& r = requests.at(id);
      const int64_t room = r.max_new - r.generated;
      // A waiting request's work is what it will compute after adopting its cached prefix.
      int64_t base = 0, catch_up = 0;
      if (auto s = planner.candidate_work(id, &base, &catch_up); !s.ok()) return fail(s, "candidate_work"), 1;
      batch.push_back(specd::ControllerRequest{id, static_cast<int32_t>(base),
                                               static_cast<int32_t>(std::min<int64_t>(k_max, room - 1)),
                                               static_cast<int32_t>(catch_up), room});
    }
    std::vector<specd::ControllerDecision> decisions;
    if (auto s = controller.decide(batch, &decisions); !s.ok()) return fail(s, "decide"), 1;
    std::vector<specd::PlannedDecision> planned;
    for (std::size_t i = 0; i < batch.size(); ++i)
      planned.push_back(specd::PlannedDecision{batch[i].id, decisions[i].k,
                                               decisions[i].k > 0 ? specd::ProposalKind::kDraftModel
                                                                  : specd::ProposalKind::kNone});
    specd::StepPlan plan;
    if (auto s = planner.plan(planned, &plan); !s.ok()) return fail(s, "plan"), 1;
    if (plan.items.empty()) {
      std::fprintf(stderr, "nothing could be scheduled: the pool is too small\n");
      return 1;
    }
    ++steps;
    for (specd::RequestId id : plan.preempted) {
      Request& r = requests.at(id);
      r.computed_t = r.computed_d = 0;  // recomputed from its tokens (or the cache) when re-admitted
      ++preemptions;
    }
    for (const specd::WorkPlan& w : plan.items)
      if (std::find(plan.admitted.begin(), plan.admitted.end(), w.id) != plan.admitted.end()) {
        Request& r = requests.at(w.id);  // its KV starts with what it adopted from the prefix cache
        r.computed_t = w.cached_target;
        r.computed_d = w.cached_draft;
      }
    // (A real server copies the plan's copy-on-write pages, then runs the draft loop and the
    // target forward over the items' slots; here the forwards are timed by the model above.)
    int64_t target_tokens = 0, draft_depth = 0, draft_first = 0;
    for (const specd::WorkPlan& w : plan.items) {
      target_tokens += w.num_tokens();
      draft_depth = std::max<int64_t>(draft_depth, w.k);
      draft_first += w.draft_catch_up;
    }
    double seconds = forward_seconds(target_tokens, 0.020);
    if (auto s = controller.observe_forward(specd::ForwardKind::kTarget, target_tokens, seconds); !s.ok())
      return fail(s, "observe_forward"), 1;
    for (int64_t j = 0; j < draft_depth; ++j) {
      int64_t n = 0;
      for (const specd::WorkPlan& w : plan.items) n += w.k > j ? (j == 0 ? w.draft_catch_up : 1) : 0;
      const double t = forward_seconds(n, 0.004);
      seconds += t;
      if (auto s = controller.observe_forward(specd::ForwardKind::kDraft, n, t); !s.ok()) return fail(s, "observe"), 1;
    }
    // The step's time outside the forwards, with what it did (the controller learns the host
    // time speculation adds: overhead_model.h).
    specd::StepShape shape{static_cast<int64_t>(plan.items.size()), 0, 0, draft_depth};
    for (const specd::WorkPlan& w : plan.items) {
      shape.drafting_requests += w.k > 0 ? 1 : 0;
      shape.draft_tokens += w.k;
    }
    const double host = 0.0003 + 0.00005 * static_cast<double>(shape.drafting_requests);
    if (auto s = controller.observe_overhead(host, shape); !s.ok()) return fail(s, "observe_overhead"), 1;

    // Verify and commit: the engine's rules (accepted drafts, then the bonus token).
    int64_t emitted = 0;
    for (const specd::WorkPlan& w : plan.items) {
      Request& r = requests.at(w.id);
      int32_t accepted = 0;
      if (w.decide) {
        std::bernoulli_distribution accept(r.alpha);
        while (accepted < w.k && accept(rng)) ++accepted;
      }
      const int32_t target_commit = w.num_prefix + (w.decide ? 1 + accepted : 0);
      if (auto s = bm->commit(w.id, kTarget, target_commit); !s.ok()) return fail(s, "commit"), 1;
      r.computed_t += target_commit;
      if (!w.draft_slots.empty()) {
        const int32_t keep = w.draft_catch_up + std::min(accepted, w.k - 1);
        if (auto s = bm->commit(w.id, kDraft, keep); !s.ok()) return fail(s, "commit"), 1;
        r.computed_d += keep;
      }
      if (!w.decide) continue;
      ++decided;
      speculated += w.k > 0 ? 1 : 0;
      drafted[r.alpha > 0.5] += w.k;
      ++verifies[r.alpha > 0.5];
      if (w.k > 0)
        if (auto s = controller.observe(w.id, 0, w.k, accepted); !s.ok()) return fail(s, "observe"), 1;
      const int64_t emit = std::min<int64_t>(accepted + 1, r.max_new - r.generated);
      for (int64_t i = 0; i < emit; ++i) r.tokens.push_back(token(rng));
      r.generated += emit;
      emitted += emit;
      if (r.generated >= r.max_new) {  // its last full blocks get registered
        if (auto s = planner.finish(w.id, r.new_tokens()); !s.ok()) return fail(s, "finish"), 1;
        controller.forget(w.id, r.generated);
        requests.erase(w.id);
        ++finished;
      }
    }
    tokens += emitted;
    if (auto s = controller.observe_step(emitted, seconds + 0.0005, static_cast<int64_t>(planner.waiting().size()));
        !s.ok())
      return fail(s, "observe_step"), 1;
    if (auto s = bm->check_invariants(); !s.ok()) return fail(s, "check_invariants"), 1;
  }

  // Cached pages nothing references count as free (evictable).
  if (bm->num_free_pages() != bm->num_pages()) {
    std::fprintf(stderr, "leak: %d of %d pages still used\n", bm->num_used_pages(), bm->num_pages());
    return 1;
  }
  // Requests whose drafts are mostly accepted should get more of them per step.
  const double k_good = static_cast<double>(drafted[1]) / std::max<int64_t>(1, verifies[1]);
  const double k_poor = static_cast<double>(drafted[0]) / std::max<int64_t>(1, verifies[0]);
  const specd::PrefixHitStats& hits = planner.prefix_hit_stats();
  std::printf("specd embed example: %lld requests, %lld steps, %lld tokens, %lld preemptions, %.0f%% of verify "
              "steps speculated, mean k %.2f for good drafts (85%% accepted) vs %.2f for poor ones (20%%), "
              "prefix cache: %lld of %lld tokens adopted at %lld admissions (%lld prompt tokens in all), all %d "
              "pages free\n",
              static_cast<long long>(finished), static_cast<long long>(steps), static_cast<long long>(tokens),
              static_cast<long long>(preemptions), 100.0 * static_cast<double>(speculated) / std::max<int64_t>(1, decided),
              k_good, k_poor, static_cast<long long>(hits.hit_tokens), static_cast<long long>(hits.query_tokens),
              static_cast<long long>(hits.admissions), static_cast<long long>(prompt_tokens), bm->num_pages());
  // Requests admitted after the first step find the system prompt's 4 whole blocks cached
  // (those admitted together in the first step cannot: nothing is computed yet).
  return finished == 16 && k_good > k_poor && hits.hit_tokens >= 4 * 64 ? 0 : 1;
}
