#include "specd/ngram_proposer.h"

#include <algorithm>
#include <cstring>

#include "hash_util.h"

namespace specd {

namespace {

constexpr uint64_t kBase = 0x9e3779b97f4a7c15ULL;  // odd multiplier of the polynomial hash

using detail::mix64;

// Open-addressing map n-gram key -> most recent end position. A key whose chain became empty
// (truncate removed its only position) keeps its slot with value -1, which reads as absent:
// no deletion logic, and a key that comes back reuses its slot. Slots are bounded by the
// distinct n-grams ever indexed.
class HeadTable {
 public:
  int32_t get(uint64_t key) const {
    if (keys_.empty()) return -1;
    const std::size_t i = slot(key);
    return vals_[i] == kEmpty ? -1 : vals_[i];
  }
  void set(uint64_t key, int32_t value) {
    if (10 * (used_ + 1) > 7 * keys_.size()) grow();  // load factor <= 0.7
    const std::size_t i = slot(key);
    if (vals_[i] == kEmpty) {
      keys_[i] = key;
      ++used_;
    }
    vals_[i] = value;
  }
  int64_t memory_bytes() const {
    return static_cast<int64_t>(keys_.capacity() * sizeof(uint64_t) +
                                vals_.capacity() * sizeof(int32_t));
  }

 private:
  static constexpr int32_t kEmpty = -2;
  // The slot holding `key`, or the empty slot where it would go.
  std::size_t slot(uint64_t key) const {
    const std::size_t mask = keys_.size() - 1;
    std::size_t i = mix64(key) & mask;
    while (vals_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask;
    return i;
  }
  void grow() {
    std::vector<uint64_t> old_keys = std::move(keys_);
    std::vector<int32_t> old_vals = std::move(vals_);
    const std::size_t cap = std::max<std::size_t>(16, 2 * old_keys.size());
    keys_.assign(cap, 0);
    vals_.assign(cap, kEmpty);
    used_ = 0;
    for (std::size_t i = 0; i < old_keys.size(); ++i)
      if (old_vals[i] != kEmpty) set(old_keys[i], old_vals[i]);
  }

  std::vector<uint64_t> keys_;
  std::vector<int32_t> vals_;
  std::size_t used_ = 0;
};

}  // namespace

// ---- per-request index ----

class NgramProposer::Index {
 public:
  explicit Index(const NgramConfig& c)
      : n_min_(c.n_min), n_max_(c.n_max), range_(c.n_max - c.n_min + 1), bits_(c.hash_bits),
        heads_(static_cast<std::size_t>(range_)) {
    pow_.push_back(1);
    for (int32_t n = 1; n <= n_max_; ++n) pow_.push_back(pow_.back() * kBase);
    prefix_.push_back(0);
  }

  int32_t length() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t token(int32_t pos) const { return tokens_[static_cast<std::size_t>(pos)]; }
  const int32_t* data() const { return tokens_.data(); }

  // Polynomial hash of the n tokens ending at `end` (inclusive), from prefix hashes.
  uint64_t hash(int32_t end, int32_t n) const {
    return prefix_[static_cast<std::size_t>(end) + 1] -
           prefix_[static_cast<std::size_t>(end + 1 - n)] * pow_[static_cast<std::size_t>(n)];
  }
  // Previous end position of an n-gram with the same key as the one ending at `end`.
  int32_t prev(int32_t end, int32_t n) const {
    return prev_[static_cast<std::size_t>(end) * range_ + static_cast<std::size_t>(n - n_min_)];
  }
  // Are the n-grams ending at a and b equal? (verifies a chain entry against a collision)
  bool same(int32_t a, int32_t b, int32_t n) const {
    return std::memcmp(data() + (a + 1 - n), data() + (b + 1 - n),
                       static_cast<std::size_t>(n) * sizeof(int32_t)) == 0;
  }

  void push(int32_t t) {
    tokens_.push_back(t);
    prefix_.push_back(prefix_.back() * kBase + static_cast<uint64_t>(t) + 1);
    const int32_t pos = length() - 1;
    for (int32_t n = n_min_; n <= n_max_; ++n) {
      int32_t older = -1;
      if (pos + 1 >= n) {
        HeadTable& head = heads_[static_cast<std::size_t>(n - n_min_)];
        const uint64_t k = key(pos, n);
        older = head.get(k);
        head.set(k, pos);
      }
      prev_.push_back(older);
    }
  }

  // Removes the last token. Its n-grams are the newest entries of their chains, so putting
  // each chain's previous head back is an exact undo.
  void pop() {
    const int32_t pos = length() - 1;
    for (int32_t n = n_min_; n <= n_max_ && n <= pos + 1; ++n)
      heads_[static_cast<std::size_t>(n - n_min_)].set(key(pos, n), prev(pos, n));
    prev_.resize(static_cast<std::size_t>(pos) * range_);
    tokens_.pop_back();
    prefix_.pop_back();
  }

  int64_t memory_bytes() const {
    int64_t bytes = static_cast<int64_t>(tokens_.capacity() * sizeof(int32_t) +
                                         prefix_.capacity() * sizeof(uint64_t) +
                                         prev_.capacity() * sizeof(int32_t));
    for (const HeadTable& h : heads_) bytes += h.memory_bytes();
    return bytes;
  }

  uint64_t batch_mark = 0;  // duplicate-id detection in propose_batch

 private:
  uint64_t key(int32_t end, int32_t n) const {
    const uint64_t h = mix64(hash(end, n));
    return bits_ >= 64 ? h : h >> (64 - bits_);
  }

  int32_t n_min_, n_max_;
  std::size_t range_;
  int32_t bits_;
  std::vector<uint64_t> pow_;     // [n_max + 1] kBase^n
  std::vector<int32_t> tokens_;   // [L]
  std::vector<uint64_t> prefix_;  // [L + 1] prefix hashes
  std::vector<int32_t> prev_;     // [L, range] chain links
  std::vector<HeadTable> heads_;  // [range]
};

// ---- lifecycle ----

NgramProposer::NgramProposer(const NgramConfig& config) : config_(config), requests_("ngram proposer") {}
NgramProposer::~NgramProposer() = default;

Status NgramProposer::create(const NgramConfig& c, std::unique_ptr<NgramProposer>* out) {
  if (c.n_min < 1 || c.n_min > c.n_max || c.n_max > kMaxN)
    return error_status(StatusCode::kInvalidArgument, "ngram config: need 1 <= n_min <= n_max <= ",
                        kMaxN, ", got n_min ", c.n_min, ", n_max ", c.n_max);
  if (c.max_candidates < 1)
    return error_status(StatusCode::kInvalidArgument, "ngram config: max_candidates must be >= 1, got ",
                        c.max_candidates);
  if (c.max_scan < c.max_candidates)
    return error_status(StatusCode::kInvalidArgument, "ngram config: max_scan (", c.max_scan,
                        ") must be >= max_candidates (", c.max_candidates, ")");
  if (c.order != NgramOrder::kRecent && c.order != NgramOrder::kFrequent)
    return error_status(StatusCode::kInvalidArgument, "ngram config: unknown order ",
                        static_cast<int>(c.order));
  if (c.hash_bits < 1 || c.hash_bits > 64)
    return error_status(StatusCode::kInvalidArgument, "ngram config: hash_bits must be in [1, 64], got ",
                        c.hash_bits);
  out->reset(new NgramProposer(c));
  return Status::Ok();
}

Status NgramProposer::add_request(RequestId id, Span<const int32_t> prompt) {
  SPECD_RETURN_IF_ERROR(requests_.check_add(id, prompt, kMaxHistory));
  auto ix = std::make_unique<Index>(config_);
  for (int32_t t : prompt) ix->push(t);
  requests_.insert(id, std::move(ix));
  return Status::Ok();
}

Status NgramProposer::append(RequestId id, Span<const int32_t> tokens) {
  Index* ix = nullptr;
  SPECD_RETURN_IF_ERROR(requests_.find(id, &ix));
  SPECD_RETURN_IF_ERROR(requests_.check_append(id, *ix, tokens, kMaxHistory));
  for (int32_t t : tokens) ix->push(t);
  return Status::Ok();
}

Status NgramProposer::truncate(RequestId id, int64_t new_len) {
  Index* ix = nullptr;
  SPECD_RETURN_IF_ERROR(requests_.find(id, &ix));
  SPECD_RETURN_IF_ERROR(requests_.check_truncate(id, *ix, new_len));
  while (ix->length() > new_len) ix->pop();
  return Status::Ok();
}

Status NgramProposer::remove_request(RequestId id, RemoveReason /*reason: no global state*/) {
  Index* ix = nullptr;
  SPECD_RETURN_IF_ERROR(requests_.find(id, &ix));
  requests_.erase(id);
  return Status::Ok();
}

bool NgramProposer::contains(RequestId id) const { return requests_.contains(id); }

int64_t NgramProposer::history_length(RequestId id) const { return requests_.length(id); }

int64_t NgramProposer::memory_bytes() const {
  int64_t bytes = 0;
  requests_.for_each([&bytes](const Index& ix) { bytes += ix.memory_bytes(); });
  return bytes;
}

// ---- proposals ----

Status NgramProposer::propose_batch(Span<const RequestId> ids, Span<const int32_t> max_depth,
                                    Span<const int32_t> max_nodes, TokenTreeBatch* out) {
  SPECD_RETURN_IF_ERROR(requests_.gather(ids, max_depth, max_nodes, &batch_));
  out->clear();
  for (std::size_t i = 0; i < ids.size(); ++i) propose_one(*batch_[i], max_depth[i], max_nodes[i], out);
  return Status::Ok();
}

void NgramProposer::add_continuation(const Index& ix, int32_t end, int32_t k) {
  const int32_t start = end + 1;
  const int32_t len = std::min(k, ix.length() - start);
  // A cheap fingerprint first (prefix hashes would need kBase^len for any depth len).
  uint64_t h = static_cast<uint64_t>(len);
  for (int32_t j = start; j < start + len; ++j) h = h * kBase + static_cast<uint64_t>(ix.token(j)) + 1;
  for (Continuation& c : conts_) {
    if (c.length == len && c.hash == h &&
        std::memcmp(ix.data() + c.start, ix.data() + start,
                    static_cast<std::size_t>(len) * sizeof(int32_t)) == 0) {
      ++c.count;
      return;
    }
  }
  conts_.push_back(Continuation{start, len, 1, h});
}

bool NgramProposer::collect(const Index& ix, int32_t k) {
  const int32_t last = ix.length() - 1;
  const auto want = static_cast<std::size_t>(config_.max_candidates);
  const auto scan_max = static_cast<std::size_t>(config_.max_scan);
  scan_.clear();
  conts_.clear();
  for (int32_t n = config_.n_max; n >= config_.n_min; --n) {
    if (ix.length() <= n) continue;
    scan_.clear();
    conts_.clear();
    // The chain starts at the suffix itself (the newest entry); its older entries all end
    // at <= L-2, so each has a following token.
    for (int32_t e = ix.prev(last, n); e >= 0; e = ix.prev(e, n)) {
      if (!ix.same(e, last, n)) continue;  // hash collision, not an occurrence
      scan_.push_back(e);
      add_continuation(ix, e, k);
      if (config_.order == NgramOrder::kRecent && conts_.size() == want) break;
      if (scan_.size() == scan_max) break;
    }
    if (!scan_.empty()) break;
  }
  if (scan_.empty()) return false;
  if (config_.order == NgramOrder::kFrequent) select_frequent();
  return true;
}

// Most frequent first; stable, so equal counts keep recency order (conts_ were created in
// the order of their most recent occurrence).
void NgramProposer::select_frequent() {
  std::stable_sort(conts_.begin(), conts_.end(),
                   [](const Continuation& a, const Continuation& b) { return a.count > b.count; });
  if (conts_.size() > static_cast<std::size_t>(config_.max_candidates))
    conts_.resize(static_cast<std::size_t>(config_.max_candidates));
}

void NgramProposer::propose_one(const Index& ix, int32_t k, int32_t max_nodes, TokenTreeBatch* out) {
  const int32_t root = ix.token(ix.length() - 1);
  if (k == 0 || max_nodes == 0 || !collect(ix, k)) {
    const float one = 1.0f;
    out->append(TokenTree(root), Span<const float>(&one, 1));
    return;
  }
  candidates_.resize(conts_.size());
  for (std::size_t c = 0; c < conts_.size(); ++c)
    candidates_[c].assign(ix.data() + conts_[c].start, ix.data() + conts_[c].start + conts_[c].length);
  const TokenTree tree = TokenTree::from_candidates(root, candidates_, max_nodes);

  // node_probs: the share of scanned occurrences whose continuation runs through each node.
  node_hits_.assign(static_cast<std::size_t>(tree.size()), 0);
  for (int32_t e : scan_) {
    const int32_t len = std::min(k, ix.length() - 1 - e);
    int32_t node = 0;
    for (int32_t j = 1; j <= len; ++j) {
      node = tree.find_child(node, ix.token(e + j));
      if (node < 0) break;
      ++node_hits_[static_cast<std::size_t>(node)];
    }
  }
  probs_.assign(static_cast<std::size_t>(tree.size()), 1.0f);
  const auto scanned = static_cast<float>(scan_.size());
  for (int32_t i = 1; i < tree.size(); ++i)
    probs_[static_cast<std::size_t>(i)] = static_cast<float>(node_hits_[static_cast<std::size_t>(i)]) / scanned;
  out->append(tree, probs_);
}

}  // namespace specd
