// StepPlanner: the rules of step_planner.h.
#include "specd/step_planner.h"

#include <algorithm>
#include <utility>

namespace specd {
namespace {

constexpr ModelIndex kTarget = 0, kDraft = 1;

}  // namespace

StepPlanner::StepPlanner(BlockManager* blocks, StepPlannerConfig config) : blocks_(blocks), config_(config) {}

Status StepPlanner::validate() const {
  if (blocks_ == nullptr) return error_status(StatusCode::kInvalidArgument, "StepPlanner: no block manager");
  if (config_.max_num_seqs < 1 || config_.max_num_batched_tokens < 1)
    return error_status(StatusCode::kInvalidArgument, "StepPlanner: max_num_seqs and max_num_batched_tokens must be "
                        ">= 1, got ", config_.max_num_seqs, " and ", config_.max_num_batched_tokens);
  if (config_.k_max < 0 || config_.draft_tree_width < 1 || config_.model_free_tree_nodes < -1 ||
      config_.draft_tree_nodes < -1)
    return error_status(StatusCode::kInvalidArgument, "StepPlanner: k_max >= 0, draft_tree_width >= 1 and node "
                        "budgets >= -1 are required");
  if (config_.uses_draft_kv && blocks_->num_models() < 2)
    return error_status(StatusCode::kInvalidArgument, "StepPlanner: uses_draft_kv needs a draft model in the pool");
  return Status::Ok();
}

int64_t StepPlanner::draft_fed(int32_t k) const {
  return static_cast<int64_t>(std::max(0, k - 1)) * config_.draft_tree_width;
}

int32_t StepPlanner::nodes_for(int32_t k, ProposalKind kind) const {
  if (k == 0) return 0;
  switch (kind) {
    case ProposalKind::kModelFree:
      return config_.model_free_tree_nodes >= 0 ? config_.model_free_tree_nodes : k;
    case ProposalKind::kDraftModel:
      if (config_.draft_tree_width == 1) return k;
      return config_.draft_tree_nodes >= 0 ? config_.draft_tree_nodes : k * config_.draft_tree_width;
    case ProposalKind::kNone:
      break;
  }
  return k;
}

Status StepPlanner::add(RequestId id, bool use_prefix_cache) {
  SPECD_RETURN_IF_ERROR(validate());
  if (seqs_.count(id) != 0) return error_status(StatusCode::kAlreadyExists, "StepPlanner: request ", id, " exists");
  Sequence& s = seqs_[id];
  s.state.id = id;
  s.use_prefix_cache = use_prefix_cache;
  waiting_.push_back(id);
  return Status::Ok();
}

Status StepPlanner::finish(RequestId id, Span<const int32_t> new_tokens) {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) return error_status(StatusCode::kNotFound, "StepPlanner: no request ", id);
  if (it->second.in_blocks && caching()) {
    Sequence& s = it->second;
    s.tokens.insert(s.tokens.end(), new_tokens.begin(), new_tokens.end());
    SPECD_RETURN_IF_ERROR(cache_blocks(s));
  }
  if (it->second.in_blocks) SPECD_RETURN_IF_ERROR(blocks_->free_sequence(id));
  seqs_.erase(it);
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  return Status::Ok();
}

Status StepPlanner::sync(Span<const SequenceState> states) {
  for (const SequenceState& s : states) {
    const auto it = seqs_.find(s.id);
    if (it == seqs_.end()) return error_status(StatusCode::kNotFound, "StepPlanner: no request ", s.id);
    if (s.length < 1 || s.computed_target < 0 || s.computed_target > s.length - 1 || s.computed_draft < 0 ||
        s.computed_draft > s.length || s.room < 0)
      return error_status(StatusCode::kInvalidArgument, "StepPlanner: request ", s.id, " has length ", s.length,
                          ", computed ", s.computed_target, "/", s.computed_draft, " and room ", s.room,
                          " (need length >= 1, 0 <= computed_target < length, 0 <= computed_draft <= length, "
                          "room >= 0)");
    it->second.state = s;
    it->second.state.new_tokens = {};
    if (caching()) {
      SPECD_RETURN_IF_ERROR(take_tokens(it->second, s.new_tokens, s.length));
      if (it->second.in_blocks) SPECD_RETURN_IF_ERROR(cache_blocks(it->second));
    }
  }
  return Status::Ok();
}

Status StepPlanner::take_tokens(Sequence& s, Span<const int32_t> new_tokens, int64_t length) {
  const int64_t keep = length - static_cast<int64_t>(new_tokens.size());
  if (keep < 0 || keep > static_cast<int64_t>(s.tokens.size()))
    return error_status(StatusCode::kInvalidArgument, "StepPlanner: request ", s.state.id, " of length ", length,
                        " sends ", new_tokens.size(), " new token(s) but the planner holds ", s.tokens.size(),
                        " of its tokens (new_tokens must be its tokens past the ones already sent)");
  s.tokens.resize(static_cast<std::size_t>(keep));
  s.tokens.insert(s.tokens.end(), new_tokens.begin(), new_tokens.end());
  return Status::Ok();
}

Status StepPlanner::cache_blocks(const Sequence& s) {
  SPECD_RETURN_IF_ERROR(blocks_->cache_blocks(s.state.id, kTarget, s.tokens));
  if (config_.uses_draft_kv) SPECD_RETURN_IF_ERROR(blocks_->cache_blocks(s.state.id, kDraft, s.tokens));
  return Status::Ok();
}

std::vector<RequestId> StepPlanner::candidates() const {
  std::vector<RequestId> out(running_);
  const std::size_t free = static_cast<std::size_t>(std::max<int64_t>(
      0, static_cast<int64_t>(config_.max_num_seqs) - static_cast<int64_t>(running_.size())));
  for (std::size_t i = 0; i < waiting_.size() && i < free; ++i) out.push_back(waiting_[i]);
  return out;
}

Status StepPlanner::cached_prefix(RequestId id, int64_t* target, int64_t* draft) const {
  *target = *draft = 0;
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) return error_status(StatusCode::kNotFound, "StepPlanner: unknown request ", id);
  const Sequence& s = it->second;
  if (s.in_blocks || !caching() || !s.use_prefix_cache) return Status::Ok();
  const int64_t limit = s.state.length - 1;  // as admit(): the last token is always fed
  *target = blocks_->cached_prefix(kTarget, s.tokens, limit);
  if (config_.uses_draft_kv) *draft = blocks_->cached_prefix(kDraft, s.tokens, limit);
  return Status::Ok();
}

Status StepPlanner::candidate_work(RequestId id, int64_t* base_tokens, int64_t* draft_catch_up) const {
  int64_t cached_t = 0, cached_d = 0;
  SPECD_RETURN_IF_ERROR(cached_prefix(id, &cached_t, &cached_d));
  const SequenceState& st = seqs_.at(id).state;
  *base_tokens = st.length - std::max(st.computed_target, cached_t);
  *draft_catch_up = st.length - std::max(st.computed_draft, cached_d);
  return Status::Ok();
}

bool StepPlanner::plan_item(const Sequence& s, int32_t budget, const PlannedDecision* d, WorkPlan* item) const {
  if (budget <= 0) return false;
  const SequenceState& st = s.state;
  const auto prefix = static_cast<int32_t>(st.length - 1 - st.computed_target);
  const int64_t cap = std::min<int64_t>(config_.k_max, st.room - 1);
  const int32_t k = d == nullptr ? 0 : static_cast<int32_t>(std::max<int64_t>(0, std::min<int64_t>(d->k, cap)));
  const ProposalKind kind = d != nullptr && k > 0 ? d->kind : ProposalKind::kNone;
  const int32_t nodes = nodes_for(k, kind);
  *item = WorkPlan{};
  item->id = st.id;
  if (static_cast<int64_t>(prefix) + 1 + nodes <= budget) {
    item->num_prefix = prefix;
    item->decide = true;
    item->k = k;
    item->nodes = nodes;
    item->fits = true;
    return true;
  }
  if (prefix > 0) {  // a prefill chunk only
    item->num_prefix = std::min(prefix, budget);
    return true;
  }
  item->decide = true;  // decode with a smaller proposal
  item->nodes = budget - 1;
  item->k = std::min(k, item->nodes);
  if (item->k == 0) item->nodes = 0;
  return true;
}

Status StepPlanner::reserve(Sequence& s, WorkPlan* item, ProposalKind kind, StepPlan* out, bool* ok) {
  *ok = false;
  const RequestId id = s.state.id;
  Status st = blocks_->reserve(id, kTarget, item->num_tokens(), &scratch_);
  if (st.code() == StatusCode::kOutOfPages) return Status::Ok();
  SPECD_RETURN_IF_ERROR(st);
  item->target_slots = scratch_.slots;
  out->copies.insert(out->copies.end(), scratch_.copies.begin(), scratch_.copies.end());
  if (kind == ProposalKind::kDraftModel && item->decide && item->k > 0) {
    item->draft_catch_up = static_cast<int32_t>(s.state.length - s.state.computed_draft);
    st = blocks_->reserve(id, kDraft, static_cast<int32_t>(item->draft_catch_up + draft_fed(item->k)), &scratch_);
    if (st.code() == StatusCode::kOutOfPages) {
      // (The target's copies stay: a page copied on write stays in its table after the rollback.)
      SPECD_RETURN_IF_ERROR(blocks_->rollback(id, kTarget, s.state.computed_target));
      item->target_slots.clear();
      item->draft_catch_up = 0;
      return Status::Ok();
    }
    SPECD_RETURN_IF_ERROR(st);
    item->draft_slots = scratch_.slots;
    out->copies.insert(out->copies.end(), scratch_.copies.begin(), scratch_.copies.end());
  }
  *ok = true;
  return Status::Ok();
}

Status StepPlanner::preempt(RequestId id, StepPlan* out) {
  Sequence& s = seqs_.at(id);
  SPECD_RETURN_IF_ERROR(blocks_->free_sequence(id));
  s.in_blocks = false;
  s.state.computed_target = s.state.computed_draft = 0;
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  waiting_.push_front(id);
  out->preempted.push_back(id);
  return Status::Ok();
}

Status StepPlanner::reserve_or_preempt(Sequence& s, WorkPlan* item, ProposalKind kind, StepPlan* out, bool* ok) {
  for (;;) {
    SPECD_RETURN_IF_ERROR(reserve(s, item, kind, out, ok));
    if (*ok) return Status::Ok();
    const RequestId victim = running_.back();
    SPECD_RETURN_IF_ERROR(preempt(victim, out));
    if (victim == s.state.id) return Status::Ok();  // *ok is false: the request itself went
  }
}

Status StepPlanner::forget_blocks(Sequence& s) {
  s.in_blocks = false;
  s.state.computed_target = s.state.computed_draft = 0;
  return blocks_->free_sequence(s.state.id);
}

Status StepPlanner::admit(Sequence& s, int32_t budget, const PlannedDecision* d, WorkPlan* item, StepPlan* out,
                          bool* ok) {
  *ok = false;
  const RequestId id = s.state.id;
  SPECD_RETURN_IF_ERROR(blocks_->add_sequence(id));
  s.in_blocks = true;
  int64_t cached_target = 0, cached_draft = 0;
  const bool lookup = caching() && s.use_prefix_cache;
  if (lookup) {  // the last token is always fed: at most length - 1 tokens come from the cache
    const int64_t limit = s.state.length - 1;
    SPECD_RETURN_IF_ERROR(blocks_->match_prefix(id, kTarget, s.tokens, limit, &cached_target));
    if (config_.uses_draft_kv) SPECD_RETURN_IF_ERROR(blocks_->match_prefix(id, kDraft, s.tokens, limit, &cached_draft));
  }
  s.state.computed_target = cached_target;
  s.state.computed_draft = cached_draft;
  if (!plan_item(s, budget, d, item)) {
    return forget_blocks(s);
  }
  const ProposalKind kind = d != nullptr && item->k > 0 ? d->kind : ProposalKind::kNone;
  const bool draft = kind == ProposalKind::kDraftModel && item->decide && item->k > 0;
  std::vector<int64_t> need{item->num_tokens()};
  if (config_.uses_draft_kv) need.push_back(draft ? s.state.length - cached_draft + draft_fed(item->k) : 0);
  if (!blocks_->can_admit(need, static_cast<int64_t>(running_.size()))) {
    return forget_blocks(s);
  }
  SPECD_RETURN_IF_ERROR(reserve(s, item, kind, out, ok));
  if (!*ok) {
    return forget_blocks(s);
  }
  item->cached_target = cached_target;
  item->cached_draft = cached_draft;
  if (lookup) {
    ++hit_stats_.admissions;
    hit_stats_.query_tokens += s.state.length;
    hit_stats_.hit_tokens += cached_target;
  }
  return Status::Ok();
}

Status StepPlanner::plan(Span<const PlannedDecision> decisions, StepPlan* out) {
  SPECD_RETURN_IF_ERROR(validate());
  *out = StepPlan{};
  std::unordered_map<RequestId, const PlannedDecision*> by_id;
  for (const PlannedDecision& d : decisions) {
    if (d.k < 0) return error_status(StatusCode::kInvalidArgument, "StepPlanner: request ", d.id, ": k must be >= 0");
    by_id[d.id] = &d;
  }
  auto decision = [&](RequestId id) -> const PlannedDecision* {
    const auto it = by_id.find(id);
    return it == by_id.end() ? nullptr : it->second;
  };
  auto kind_of = [](const WorkPlan& item, const PlannedDecision* d) {
    return d != nullptr && item.k > 0 ? d->kind : ProposalKind::kNone;
  };
  int32_t budget = config_.max_num_batched_tokens;
  for (std::size_t i = 0; i < running_.size();) {
    Sequence& s = seqs_.at(running_[i]);
    const PlannedDecision* d = decision(s.state.id);
    WorkPlan item;
    if (!plan_item(s, budget, d, &item)) {
      ++i;
      continue;
    }
    bool ok = false;
    SPECD_RETURN_IF_ERROR(reserve_or_preempt(s, &item, kind_of(item, d), out, &ok));
    if (!ok) continue;  // the request itself was preempted: running_[i] is now the next one
    budget -= item.num_tokens();
    out->items.push_back(std::move(item));
    ++i;
  }
  while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < config_.max_num_seqs && budget > 0) {
    Sequence& s = seqs_.at(waiting_.front());
    WorkPlan item;
    bool ok = false;
    SPECD_RETURN_IF_ERROR(admit(s, budget, decision(s.state.id), &item, out, &ok));
    if (!ok) break;
    waiting_.pop_front();
    running_.push_back(s.state.id);
    out->admitted.push_back(s.state.id);
    budget -= item.num_tokens();
    out->items.push_back(std::move(item));
  }
  return Status::Ok();
}

}  // namespace specd
