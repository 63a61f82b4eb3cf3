#include "specd/suffix_automaton.h"

#include "hash_util.h"

#include <algorithm>
#include <climits>

namespace specd {

namespace {

using detail::mix64;  // spreads (state, token) keys over the table's low bits

// push_back with 1.5x growth instead of the library's 2x: states and edges are most of a
// request's index, and 2x growth leaves up to half of it unused. Still amortized O(1).
template <class T>
void push_back_grown(std::vector<T>& v, const T& x) {
  if (v.size() == v.capacity()) v.reserve(v.capacity() + v.capacity() / 2 + 16);
  v.push_back(x);
}

}  // namespace

// ---- EdgeHash ----

int32_t SuffixAutomaton::EdgeHash::find(uint64_t key) const {
  if (keys_.empty()) return -1;
  const std::size_t mask = keys_.size() - 1;
  for (std::size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
    if (edges_[i] < 0) return -1;
    if (keys_[i] == key) return edges_[i];
  }
}

void SuffixAutomaton::EdgeHash::insert(uint64_t key, int32_t edge) {
  // Load factor <= 0.7: short probe runs with a well-mixed key.
  if (10 * (used_ + 1) > 7 * keys_.size()) grow();
  const std::size_t mask = keys_.size() - 1;
  std::size_t i = mix64(key) & mask;
  while (edges_[i] >= 0) i = (i + 1) & mask;
  keys_[i] = key;
  edges_[i] = edge;
  ++used_;
}

void SuffixAutomaton::EdgeHash::grow() {
  std::vector<uint64_t> old_keys = std::move(keys_);
  std::vector<int32_t> old_edges = std::move(edges_);
  const std::size_t cap = std::max<std::size_t>(64, 2 * old_keys.size());
  keys_.assign(cap, 0);
  edges_.assign(cap, -1);
  used_ = 0;
  for (std::size_t i = 0; i < old_keys.size(); ++i)
    if (old_edges[i] >= 0) insert(old_keys[i], old_edges[i]);
}

int64_t SuffixAutomaton::EdgeHash::memory_bytes() const {
  return static_cast<int64_t>(keys_.capacity() * sizeof(uint64_t) +
                              edges_.capacity() * sizeof(int32_t));
}

// ---- construction ----

SuffixAutomaton::SuffixAutomaton(int32_t count_cap)
    : count_cap_(std::clamp(count_cap, 1, kMaxCountCap)) {
  new_state(0, -1, 0);  // the root
}

uint64_t SuffixAutomaton::edge_key(int32_t state, int32_t token) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) |
         static_cast<uint64_t>(static_cast<uint32_t>(token));
}

int32_t SuffixAutomaton::new_state(int32_t len, int32_t link, uint32_t count) {
  State s{len, link, -1, 0, 0};
  s.count = count & 0xffffffu;
  push_back_grown(states_, s);
  return num_states() - 1;
}

int32_t SuffixAutomaton::push_edge(int32_t token, int32_t target, int32_t next) {
  push_back_grown(edges_, Edge{token, target, next});
  return static_cast<int32_t>(edges_.size()) - 1;
}

void SuffixAutomaton::add_edge(int32_t state, int32_t token, int32_t target) {
  const int32_t e = push_edge(token, target, at(state).first_edge);  // prepend: newest first
  State& s = at(state);
  s.first_edge = e;
  if (s.degree < kDegreeSaturated) ++s.degree;
  if (s.degree == kListMax + 1) {
    // The list just became too long to scan: hash all of it and keep a summary from now on
    // (the new edge's count is still 0; add_occurrence counts it).
    index_edges(state);
    summaries_[state] = scan_summary(state);
  } else if (s.degree > kListMax) {
    hash_.insert(edge_key(state, token), e);
  }
}

void SuffixAutomaton::index_edges(int32_t state) {
  for (int32_t e = at(state).first_edge; e >= 0; e = edges_[static_cast<std::size_t>(e)].next)
    hash_.insert(edge_key(state, edges_[static_cast<std::size_t>(e)].token), e);
}

// A copy of q with length `len`, q's count and q's transitions, in q's order (copied edges
// are laid out consecutively, so the list is built front to back). The targets are the same,
// so a hashed q's summary carries over, its best edge mapped to the copy.
int32_t SuffixAutomaton::clone_state(int32_t q, int32_t len) {
  const int32_t clone = new_state(len, at(q).link, at(q).count);
  if (at(q).first_edge < 0) return clone;
  Summary sum = hashed(q) ? summary(q) : Summary{};  // only hashed states store one
  const int32_t q_best = sum.best_edge;
  const auto base = static_cast<int32_t>(edges_.size());
  for (int32_t e = at(q).first_edge; e >= 0; e = edges_[static_cast<std::size_t>(e)].next) {
    const Edge copy = edges_[static_cast<std::size_t>(e)];
    const auto index = static_cast<int32_t>(edges_.size());
    if (e == q_best) sum.best_edge = index;
    push_edge(copy.token, copy.target, index + 1);
  }
  edges_.back().next = -1;
  at(clone).first_edge = base;
  at(clone).degree = at(q).degree;
  if (hashed(clone)) {
    index_edges(clone);
    summaries_[clone] = sum;
  }
  return clone;
}

Status SuffixAutomaton::append(int32_t token) {
  if (size_ >= kMaxTokens)
    return error_status(StatusCode::kOutOfRange, "suffix automaton is full (", kMaxTokens,
                        " tokens); cannot append token ", token);
  extend(token);
  return Status::Ok();
}

Status SuffixAutomaton::append(Span<const int32_t> tokens) {
  if (static_cast<int64_t>(tokens.size()) > kMaxTokens - size_)
    return error_status(StatusCode::kOutOfRange, "suffix automaton holds ", size_,
                        " tokens; appending ", tokens.size(), " would pass the limit ",
                        kMaxTokens);
  for (int32_t token : tokens) extend(token);
  return Status::Ok();
}

// The textbook online construction (Blumer et al.), followed by the count update.
void SuffixAutomaton::extend(int32_t token) {
  const int32_t prev_last = last_;
  const int32_t cur = new_state(at(last_).len + 1, 0, 0);
  int32_t p = last_;
  while (p >= 0 && find_edge(p, token) < 0) {
    add_edge(p, token, cur);
    p = at(p).link;
  }
  if (p >= 0) {
    const int32_t q = transition(p, token);
    if (at(p).len + 1 == at(q).len) {
      at(cur).link = q;
    } else {
      // q also holds longer strings that do not end here: split off the short ones.
      const int32_t clone = clone_state(q, at(p).len + 1);
      for (; p >= 0; p = at(p).link) {
        const int32_t e = find_edge(p, token);
        if (e < 0 || edges_[static_cast<std::size_t>(e)].target != q) break;
        edges_[static_cast<std::size_t>(e)].target = clone;
      }
      at(q).link = clone;
      at(cur).link = clone;
    }
  }
  last_ = cur;
  ++size_;
  add_occurrence(cur, prev_last, token);
}

// The new end position belongs to exactly the states on cur's suffix-link chain (but the
// root). A clone starts with its original's count and gains this position here.
// The transitions whose target count grew are `token`'s transitions from the states p on
// the previous last state's chain, up to the first whose target was at the cap: a state of
// length len_stop at the cap is the target of exactly the p with len(p) < len_stop (the
// targets' lengths bound the sources'), so the walk stops there. Only hashed states keep a
// summary to update; the others' are computed when asked.
void SuffixAutomaton::add_occurrence(int32_t cur, int32_t prev_last, int32_t token) {
  // These walks are the hot loop of "aaaa..." (count_cap steps per token): plain pointers.
  State* const st = states_.data();
  const auto cap = static_cast<uint32_t>(count_cap_);
  int32_t s = cur;
  for (; s > 0 && st[s].count < cap; s = st[s].link) st[s].count = (st[s].count + 1) & 0xffffffu;
  if (token < 0) return;  // separators are not continuations: no summary changes
  const int32_t len_stop = s > 0 ? st[s].len : 0;
  for (int32_t p = prev_last; p >= 0 && st[p].len >= len_stop; p = st[p].link) {
    if (st[p].degree <= kListMax) continue;  // not hashed: no stored summary
    const auto it = summaries_.find(p);
    if (it == summaries_.end()) continue;  // cannot happen: hashed states have one
    Summary& sum = it->second;
    ++sum.token_total;
    const int32_t e = find_edge(p, token);
    if (sum.best_edge < 0 || better(e, sum.best_edge)) sum.best_edge = e;
  }
}

bool SuffixAutomaton::better(int32_t e, int32_t than) const {
  const Edge& a = edges_[static_cast<std::size_t>(e)];
  const Edge& b = edges_[static_cast<std::size_t>(than)];
  const int32_t ca = count(a.target), cb = count(b.target);
  return ca > cb || (ca == cb && a.token < b.token);
}

SuffixAutomaton::Summary SuffixAutomaton::summary(int32_t state) const {
  if (hashed(state)) {
    const auto it = summaries_.find(state);
    if (it != summaries_.end()) return it->second;
  }
  return scan_summary(state);
}

SuffixAutomaton::Summary SuffixAutomaton::scan_summary(int32_t state) const {
  Summary sum;
  for (int32_t e = at(state).first_edge; e >= 0; e = edges_[static_cast<std::size_t>(e)].next) {
    if (edges_[static_cast<std::size_t>(e)].token < 0) continue;
    sum.token_total += count(edges_[static_cast<std::size_t>(e)].target);
    if (sum.best_edge < 0 || better(e, sum.best_edge)) sum.best_edge = e;
  }
  return sum;
}

// ---- queries ----

int32_t SuffixAutomaton::find_edge(int32_t state, int32_t token) const {
  const State& s = at(state);
  if (s.degree > kListMax) return hash_.find(edge_key(state, token));
  for (int32_t e = s.first_edge; e >= 0; e = edges_[static_cast<std::size_t>(e)].next)
    if (edges_[static_cast<std::size_t>(e)].token == token) return e;
  return -1;
}

int32_t SuffixAutomaton::transition(int32_t state, int32_t token) const {
  const int32_t e = find_edge(state, token);
  return e < 0 ? -1 : edges_[static_cast<std::size_t>(e)].target;
}

int32_t SuffixAutomaton::out_degree(int32_t state) const {
  if (at(state).degree < kDegreeSaturated) return static_cast<int32_t>(at(state).degree);
  int32_t n = 0;
  for_each_transition(state, [&](int32_t, int32_t) { ++n; });
  return n;
}

SuffixAutomaton::Continuations SuffixAutomaton::continuations(int32_t state) const {
  const Summary sum = summary(state);
  Continuations c;
  c.total = sum.token_total;
  if (sum.best_edge >= 0) {
    c.top_token = edges_[static_cast<std::size_t>(sum.best_edge)].token;
    c.top_target = edges_[static_cast<std::size_t>(sum.best_edge)].target;
  }
  return c;
}

SuffixAutomaton::Match SuffixAutomaton::advance(Match m, int32_t token, int32_t max_length) const {
  int32_t e = find_edge(m.state, token);
  while (e < 0 && m.state != 0) {
    m.state = at(m.state).link;
    m.length = at(m.state).len;
    e = find_edge(m.state, token);
  }
  if (e < 0) return Match{};  // the token never occurs
  m.state = edges_[static_cast<std::size_t>(e)].target;
  ++m.length;
  if (m.length > max_length) {  // keep the state that holds the capped length
    m.length = std::max(0, max_length);
    while (m.state != 0 && at(at(m.state).link).len >= m.length) m.state = at(m.state).link;
  }
  return m;
}

SuffixAutomaton::Match SuffixAutomaton::match(Span<const int32_t> context) const {
  Match m;
  for (int32_t token : context) m = advance(m, token, INT32_MAX);
  return m;
}

int64_t SuffixAutomaton::memory_bytes() const {
  // unordered_map nodes: the pair plus a next pointer, and one bucket pointer per entry.
  const std::size_t summary_bytes = summaries_.size() * (sizeof(Summary) + 4 + 2 * sizeof(void*));
  return static_cast<int64_t>(states_.capacity() * sizeof(State) +
                              edges_.capacity() * sizeof(Edge) + summary_bytes) +
         hash_.memory_bytes();
}

}  // namespace specd
