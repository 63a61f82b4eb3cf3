// Embedding specd's KV block manager in a C++ server: a simulated speculative decode loop.
//
// Several requests share one page pool for a target and a draft model. Each step, every
// running request reserves lookahead slots for the target (last token + k draft tokens) and
// the draft (k tokens), "verifies" (a random number of drafts is accepted), and commits what
// was accepted; rejected slots are rolled back by the commit. When the pool runs out, the
// newest running request is preempted (its pages freed) and re-admitted later, recomputing
// its prefix, exactly as a continuous-batching scheduler would. The program checks the
// manager's invariants throughout and exits non-zero on any unexpected status.
#include <cstdio>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#include "specd/block_manager.h"

namespace {

constexpr specd::ModelIndex kTarget = 0;
constexpr specd::ModelIndex kDraft = 1;

struct Request {
  specd::SeqId id;
  int64_t prompt_len;
  int64_t generated = 0;
  int64_t max_new = 0;
  int preemptions = 0;
};

bool fail(const specd::Status& s, const char* where) {
  std::fprintf(stderr, "unexpected status in %s: %s\n", where, s.to_string().c_str());
  return false;
}

// Prefill: the target and the draft write KV for the whole prefix (prompt + generated).
specd::Status admit(specd::BlockManager& bm, const Request& r) {
  const int32_t len = static_cast<int32_t>(r.prompt_len + r.generated);
  SPECD_RETURN_IF_ERROR(bm.add_sequence(r.id));
  specd::Reservation res;
  for (specd::ModelIndex m : {kTarget, kDraft}) {
    SPECD_RETURN_IF_ERROR(bm.reserve(r.id, m, len, &res));
    SPECD_RETURN_IF_ERROR(bm.commit(r.id, m, len));
  }
  return specd::Status::Ok();
}

}  // namespace

int main() {
  // Qwen2.5-Coder-1.5B (28 layers, 2 KV heads x 128, bf16) and -0.5B (24 layers, 2 x 64).
  specd::BlockManagerConfig config;
  config.page_bytes = 16 * 28672;  // 16 target tokens per page
  config.num_pages = 48;
  config.models = {{"target", 28672}, {"draft", 12288}};
  std::unique_ptr<specd::BlockManager> bm;
  if (auto s = specd::BlockManager::create(config, &bm); !s.ok()) return fail(s, "create"), 1;

  std::mt19937 rng(2024);
  std::deque<Request> waiting;
  for (specd::SeqId id = 0; id < 12; ++id)
    waiting.push_back(Request{id, 40 + static_cast<int64_t>(rng() % 120), 0,
                              60 + static_cast<int64_t>(rng() % 100)});
  std::vector<Request> running, done;
  const int32_t k = 4;
  int64_t steps = 0, preemptions = 0, tokens = 0;

  while (!waiting.empty() || !running.empty()) {
    // Admit while the pool can hold the prefix of both models plus one step's lookahead.
    while (!waiting.empty()) {
      const Request& r = waiting.front();
      const std::vector<int64_t> need{r.prompt_len + r.generated + k + 1,
                                      r.prompt_len + r.generated + k};
      if (!bm->can_admit(need)) break;
      if (auto s = admit(*bm, r); !s.ok()) return fail(s, "admit"), 1;
      running.push_back(r);
      waiting.pop_front();
    }
    if (running.empty()) {
      std::fprintf(stderr, "request %lld cannot fit in an empty pool\n",
                   static_cast<long long>(waiting.front().id));
      return 1;
    }
    ++steps;
    // Plan: reserve lookahead for every running request, preempting the newest on failure.
    for (std::size_t i = 0; i < running.size();) {
      specd::Reservation res;
      specd::Status st = bm->reserve(running[i].id, kTarget, k + 1, &res);
      if (st.ok()) {
        st = bm->reserve(running[i].id, kDraft, k, &res);
        if (!st.ok()) (void)bm->rollback(running[i].id, kTarget, running[i].prompt_len + running[i].generated);
      }
      if (st.code() == specd::StatusCode::kOutOfPages) {
        Request victim = running.back();
        running.pop_back();
        if (auto s = bm->free_sequence(victim.id); !s.ok()) return fail(s, "preempt"), 1;
        ++victim.preemptions;
        ++preemptions;
        waiting.push_front(victim);
        continue;  // retry request i (or stop if it was the victim)
      }
      if (!st.ok()) return fail(st, "reserve"), 1;
      ++i;
    }
    // Verify + commit: accept a random number of drafts, plus the bonus token.
    for (std::size_t i = 0; i < running.size();) {
      Request& r = running[i];
      const int32_t accepted = static_cast<int32_t>(rng() % (k + 1));
      // Target: last token + accepted drafts now have KV; the draft: the accepted drafts.
      if (auto s = bm->commit(r.id, kTarget, 1 + accepted); !s.ok()) return fail(s, "commit"), 1;
      if (auto s = bm->commit(r.id, kDraft, accepted); !s.ok()) return fail(s, "commit"), 1;
      // Keep the draft no further ahead than the target (its KV for the bonus comes next step).
      r.generated += accepted + 1;
      tokens += accepted + 1;
      if (r.generated >= r.max_new) {
        if (auto s = bm->free_sequence(r.id); !s.ok()) return fail(s, "free"), 1;
        done.push_back(r);
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      ++i;
    }
    if (auto s = bm->check_invariants(); !s.ok()) return fail(s, "check_invariants"), 1;
  }

  if (bm->num_free_pages() != bm->num_pages()) {
    std::fprintf(stderr, "leak: %d of %d pages still used\n", bm->num_used_pages(), bm->num_pages());
    return 1;
  }
  std::printf("specd embed example: %zu requests, %lld steps, %lld tokens, %lld preemptions, "
              "block sizes target=%d draft=%d tokens/page, all %d pages free at the end\n",
              done.size(), static_cast<long long>(steps), static_cast<long long>(tokens),
              static_cast<long long>(preemptions), bm->block_size(kTarget), bm->block_size(kDraft),
              bm->num_pages());
  return done.size() == 12 ? 0 : 1;
}
