#include "specd/suffix_proposer.h"

#include <algorithm>
#include <cmath>

namespace specd {

namespace {

// A history must fit its automaton with room for the separator when it is cached.
constexpr int64_t kMaxHistory = SuffixAutomaton::kMaxTokens - 1;
// Push-order numbers set aside per expanded node: more than any state's out-degree (< 2^32
// distinct tokens), and budget x 2^32 still fits 64 bits.
constexpr uint64_t kSeqStride = uint64_t{1} << 32;

}  // namespace

// A request's match in a cache epoch, as of its last proposal.
struct EpochMatch {
  uint64_t epoch_id;
  int64_t epoch_size;   // the epoch's size then: a grown epoch invalidates the match
  int64_t history_len;  // the history's length then
  SuffixAutomaton::Match match;
};

struct SuffixProposer::Request {
  explicit Request(int32_t count_cap) : sam(count_cap) {}
  std::vector<int32_t> tokens;  // [L] the history, to rebuild on truncate and to cache
  int64_t prompt_len = 0;       // tokens[prompt_len:] were generated
  SuffixAutomaton sam;
  std::vector<EpochMatch> matches;  // one per live epoch it was matched in
  uint64_t batch_mark = 0;          // duplicate-id detection in propose_batch
  int64_t length() const { return static_cast<int64_t>(tokens.size()); }
};

// ---- lifecycle ----

SuffixProposer::SuffixProposer(const SuffixConfig& config) : config_(config), requests_("suffix proposer") {}
SuffixProposer::~SuffixProposer() = default;

Status SuffixProposer::create(const SuffixConfig& c, std::unique_ptr<SuffixProposer>* out) {
  if (c.max_match < 1)
    return error_status(StatusCode::kInvalidArgument, "suffix config: max_match must be >= 1, got ",
                        c.max_match);
  if (!(c.spec_factor > 0.0f) || !std::isfinite(c.spec_factor))
    return error_status(StatusCode::kInvalidArgument,
                        "suffix config: spec_factor must be finite and > 0, got ", c.spec_factor);
  if (!(c.min_token_prob >= 0.0f && c.min_token_prob <= 1.0f))
    return error_status(StatusCode::kInvalidArgument,
                        "suffix config: min_token_prob must be in [0, 1], got ", c.min_token_prob);
  if (c.cache_max_tokens < 0)
    return error_status(StatusCode::kInvalidArgument,
                        "suffix config: cache_max_tokens must be >= 0, got ", c.cache_max_tokens);
  if (c.cache_epochs < 1)
    return error_status(StatusCode::kInvalidArgument, "suffix config: cache_epochs must be >= 1, got ",
                        c.cache_epochs);
  if (c.count_cap < 1 || c.count_cap > SuffixAutomaton::kMaxCountCap)
    return error_status(StatusCode::kInvalidArgument, "suffix config: count_cap must be in [1, ",
                        SuffixAutomaton::kMaxCountCap, "], got ", c.count_cap);
  out->reset(new SuffixProposer(c));
  return Status::Ok();
}

Status SuffixProposer::add_request(RequestId id, Span<const int32_t> prompt) {
  SPECD_RETURN_IF_ERROR(requests_.check_add(id, prompt, kMaxHistory));
  auto r = std::make_unique<Request>(config_.count_cap);
  r->tokens.assign(prompt.begin(), prompt.end());
  r->prompt_len = static_cast<int64_t>(prompt.size());
  SPECD_RETURN_IF_ERROR(r->sam.append(prompt));
  requests_.insert(id, std::move(r));
  return Status::Ok();
}

Status SuffixProposer::append(RequestId id, Span<const int32_t> tokens) {
  Request* r = nullptr;
  SPECD_RETURN_IF_ERROR(requests_.find(id, &r));
  SPECD_RETURN_IF_ERROR(requests_.check_append(id, *r, tokens, kMaxHistory));
  SPECD_RETURN_IF_ERROR(r->sam.append(tokens));  // cannot fail: capacity checked above
  r->tokens.insert(r->tokens.end(), tokens.begin(), tokens.end());
  return Status::Ok();
}

Status SuffixProposer::truncate(RequestId id, int64_t new_len) {
  Request* r = nullptr;
  SPECD_RETURN_IF_ERROR(requests_.find(id, &r));
  SPECD_RETURN_IF_ERROR(requests_.check_truncate(id, *r, new_len));
  if (new_len == r->length()) return Status::Ok();
  // An automaton cannot drop tokens: rebuild it (rare path, O(new_len)).
  SuffixAutomaton rebuilt(config_.count_cap);
  SPECD_RETURN_IF_ERROR(
      rebuilt.append(Span<const int32_t>(r->tokens.data(), static_cast<std::size_t>(new_len))));
  r->sam = std::move(rebuilt);
  r->tokens.resize(static_cast<std::size_t>(new_len));
  r->matches.clear();  // they matched the longer history
  r->prompt_len = std::min(r->prompt_len, new_len);
  return Status::Ok();
}

Status SuffixProposer::remove_request(RequestId id, RemoveReason reason) {
  Request* r = nullptr;
  SPECD_RETURN_IF_ERROR(requests_.find(id, &r));
  if (reason == RemoveReason::kFinished) SPECD_RETURN_IF_ERROR(add_to_cache(*r));
  requests_.erase(id);
  return Status::Ok();
}

// Appends the request's document and a separator to the newest epoch, rotating epochs first
// when the newest is full (or the document would not fit its automaton).
Status SuffixProposer::add_to_cache(const Request& r) {
  if (config_.cache_max_tokens == 0) return Status::Ok();
  const std::size_t begin = config_.cache_prompts ? 0 : static_cast<std::size_t>(r.prompt_len);
  if (begin >= r.tokens.size()) return Status::Ok();  // nothing generated
  const Span<const int32_t> doc(r.tokens.data() + begin, r.tokens.size() - begin);
  const int64_t per_epoch = std::max<int64_t>(1, config_.cache_max_tokens / config_.cache_epochs);
  if (epochs_.empty() || epochs_.back().sam.size() > per_epoch ||
      epochs_.back().sam.size() + static_cast<int64_t>(doc.size()) + 1 > SuffixAutomaton::kMaxTokens) {
    epochs_.push_back(Epoch{next_epoch_id_++, SuffixAutomaton(config_.count_cap)});
    while (static_cast<int32_t>(epochs_.size()) > config_.cache_epochs) epochs_.pop_front();
  }
  // Cannot fail: a history holds at most kMaxTokens - 1 tokens and the epoch has room.
  SPECD_RETURN_IF_ERROR(epochs_.back().sam.append(doc));
  return epochs_.back().sam.append(kSeparator);
}

bool SuffixProposer::contains(RequestId id) const { return requests_.contains(id); }

int64_t SuffixProposer::history_length(RequestId id) const { return requests_.length(id); }

int64_t SuffixProposer::cache_tokens() const {
  int64_t n = 0;
  for (const Epoch& e : epochs_) n += e.sam.size();
  return n;
}

int64_t SuffixProposer::memory_bytes() const {
  int64_t bytes = 0;
  requests_.for_each([&bytes](const Request& r) {
    bytes += r.sam.memory_bytes() + static_cast<int64_t>(r.tokens.capacity() * sizeof(int32_t));
  });
  for (const Epoch& e : epochs_) bytes += e.sam.memory_bytes();
  return bytes;
}

// ---- proposals ----

Status SuffixProposer::propose_batch(Span<const RequestId> ids, Span<const int32_t> max_depth,
                                     Span<const int32_t> max_nodes, TokenTreeBatch* out) {
  SPECD_RETURN_IF_ERROR(requests_.gather(ids, max_depth, max_nodes, &batch_));
  out->clear();
  for (std::size_t i = 0; i < ids.size(); ++i) propose_one(*batch_[i], max_depth[i], max_nodes[i], out);
  return Status::Ok();
}

int32_t SuffixProposer::budget(int32_t match_len, int32_t max_nodes) const {
  const double want = std::ceil(static_cast<double>(config_.spec_factor) * match_len);
  return want >= max_nodes ? max_nodes : static_cast<int32_t>(want);
}

SuffixAutomaton::Match SuffixProposer::epoch_match(Request& r, const Epoch& e) const {
  const auto len = static_cast<int64_t>(r.tokens.size());
  auto it = std::find_if(r.matches.begin(), r.matches.end(),
                         [&](const EpochMatch& m) { return m.epoch_id == e.id; });
  if (it == r.matches.end()) it = r.matches.insert(r.matches.end(), EpochMatch{e.id, -1, 0, {}});
  int64_t from = it->history_len;
  if (it->epoch_size != e.sam.size() || len - from > config_.max_match) {
    it->match = SuffixAutomaton::Match{};  // start over from the last max_match tokens
    from = std::max<int64_t>(0, len - config_.max_match);
  }
  for (int64_t i = from; i < len; ++i)
    it->match = e.sam.advance(it->match, r.tokens[static_cast<std::size_t>(i)], config_.max_match);
  it->epoch_size = e.sam.size();
  it->history_len = len;
  return it->match;
}

void SuffixProposer::propose_one(Request& r, int32_t max_depth, int32_t max_nodes,
                                 TokenTreeBatch* out) {
  const int32_t root = r.tokens.back();
  best_.tokens.assign(1, root);
  best_.parents.assign(1, -1);
  best_.probs.assign(1, 1.0f);
  best_.score = 0;
  auto consider = [&](const SuffixAutomaton& sam, int32_t state, int32_t length) {
    const int32_t b = budget(std::min(length, config_.max_match), max_nodes);
    if (b == 0 || max_depth == 0) return;
    // Strictly better only: ties keep the earlier source (own history, then newer epochs).
    if (expand(sam, state, root, max_depth, b) > best_.score) std::swap(best_, draft_);
  };

  if (max_depth > 0 && max_nodes > 0) {
    // Own history: the states below last_state() on its suffix-link chain hold suffixes
    // that also occurred earlier, so link(last_state()) has a continuation unless it is the
    // root; the loop only matters for separators, which histories do not hold.
    int32_t s = r.sam.link(r.sam.last_state());
    while (s > 0 && !r.sam.has_token_transition(s)) s = r.sam.link(s);
    if (s > 0) consider(r.sam, s, r.sam.len(s));

    // Forget matches in epochs that were dropped (ids below the oldest live one).
    const uint64_t oldest = epochs_.empty() ? next_epoch_id_ : epochs_.front().id;
    r.matches.erase(std::remove_if(r.matches.begin(), r.matches.end(),
                                   [&](const EpochMatch& m) { return m.epoch_id < oldest; }),
                    r.matches.end());
    for (auto it = epochs_.rbegin(); it != epochs_.rend(); ++it) {
      const SuffixAutomaton& sam = it->sam;
      SuffixAutomaton::Match m = epoch_match(r, *it);
      while (m.state > 0 && !sam.has_token_transition(m.state)) {  // e.g. only a separator
        m.state = sam.link(m.state);
        m.length = sam.len(m.state);
      }
      if (m.state > 0) consider(sam, m.state, m.length);
    }
  }

  TokenTree tree(root);
  for (std::size_t i = 1; i < best_.tokens.size(); ++i) tree.add_node(best_.parents[i], best_.tokens[i]);
  out->append(tree, best_.probs);
}

double SuffixProposer::expand(const SuffixAutomaton& sam, int32_t state, int32_t root,
                              int32_t max_depth, int32_t budget) {
  draft_.tokens.assign(1, root);
  draft_.parents.assign(1, -1);
  draft_.probs.assign(1, 1.0f);
  draft_.score = 0;
  heap_.clear();
  push_seq_ = 0;
  push_children(sam, state, 1.0, 0, 0, max_depth);
  while (!heap_.empty() && static_cast<int32_t>(draft_.tokens.size()) - 1 < budget) {
    std::pop_heap(heap_.begin(), heap_.end(), heap_order);
    const Candidate c = heap_.back();
    heap_.pop_back();
    if (c.siblings) {
      push_siblings(sam, c);
      continue;
    }
    const auto node = static_cast<int32_t>(draft_.tokens.size());
    draft_.tokens.push_back(c.token);
    draft_.parents.push_back(c.parent);
    draft_.probs.push_back(static_cast<float>(c.prob));
    draft_.score += c.prob;
    push_children(sam, c.state, c.prob, node, c.depth, max_depth);
  }
  return draft_.score;
}

void SuffixProposer::push(const Candidate& c) {
  heap_.push_back(c);
  std::push_heap(heap_.begin(), heap_.end(), heap_order);
}

// Children of tree node `node` (automaton state `state`, path_prob `prob`, depth `depth`):
// the most likely one now, a marker for the others (see the header). Probabilities are
// compared with min_token_prob in float, the precision node_probs are reported in.
// Tie-break: the children take the push-order numbers seq, seq + 1, ... (the top child, then
// the others in transition order) as if all were pushed now (kSeqStride numbers are set
// aside per call, more than any out-degree); the marker carries seq + 1, which keeps it
// ahead of its children, so the nodes popped are exactly those of eager pushing.
void SuffixProposer::push_children(const SuffixAutomaton& sam, int32_t state, double prob,
                                   int32_t node, int32_t depth, int32_t max_depth) {
  if (depth >= max_depth) return;
  const SuffixAutomaton::Continuations next = sam.continuations(state);
  if (next.total == 0) return;
  const int32_t token = next.top_token, target = next.top_target;
  const uint64_t seq = push_seq_;
  push_seq_ += kSeqStride;
  const auto total = static_cast<double>(next.total);
  const auto top = static_cast<double>(sam.count(target));
  const double top_prob = prob * top / total;
  if (static_cast<float>(top_prob) < config_.min_token_prob) return;  // so is every child
  push(Candidate{top_prob, 0, target, node, token, depth + 1, seq, false});
  const double rest_bound = std::min(top_prob, prob * (total - top) / total);
  if (total > top && static_cast<float>(rest_bound) >= config_.min_token_prob)
    push(Candidate{rest_bound, prob, state, node, token, depth + 1, seq + 1, true});
}

// The marker's children other than the top one (already pushed), each with its share of the
// continuations' occurrence counts.
void SuffixProposer::push_siblings(const SuffixAutomaton& sam, const Candidate& marker) {
  const auto total = static_cast<double>(sam.token_total(marker.state));
  uint64_t seq = marker.seq;
  sam.for_each_transition(marker.state, [&](int32_t token, int32_t target) {
    if (token < 0 || token == marker.token) return;
    const double p = marker.base * static_cast<double>(sam.count(target)) / total;
    const uint64_t my_seq = seq++;
    if (static_cast<float>(p) < config_.min_token_prob) return;
    push(Candidate{p, 0, target, marker.parent, token, marker.depth, my_seq, false});
  });
}

}  // namespace specd
