// Property test: long random sequences of BlockManager operations checked against a simple
// reference model after every step.
//
// The reference keeps, per live sequence and model, the token values it has committed and
// the values written into its reserved slots. A simulated KV storage (one value per slot)
// is written through the slots the manager hands out, with copy-on-write copies applied
// first, so any slot shared by mistake, any wrong copy or any page reused while still in use
// shows up as a sequence reading back a value it never wrote. Checked after every operation:
// - the manager's invariants (refcount == references, free list exact, no page serving two
//   models, pages holding reserved slots not shared);
// - free pages == capacity - distinct pages referenced by live sequences (no leak, no
//   double free);
// - reserved slots belong to one live sequence only;
// - every status matches the reference's prediction (including OUT_OF_PAGES exactly when
//   the pages needed exceed the free pages), and a failed call changes nothing.
// With prefix caching, each position also has a token (from a two-letter alphabet, so
// prefixes repeat) and the value written there is a rolling hash of the model and the
// tokens up to it: what real KV depends on. Sequences register their blocks at random
// times, and new sequences adopt cached prefixes of earlier sequences' tokens; every adopted
// position must read back the value of its own token prefix, so a page evicted while still
// registered, a registered page written to, or a wrong match shows up.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <ostream>
#include <random>
#include <set>

#include "block_manager_test_util.h"

namespace specd::testing {
namespace {

struct ModelRef {
  std::vector<int64_t> tokens;   // committed values, position order
  std::vector<int64_t> pending;  // values written into the reserved slots
  std::vector<int32_t> stream;   // prefix caching: the token of each committed and reserved position
};

// Prefix caching: the value at a position, from the value before it and its token.
int64_t kv_value(int64_t before, ModelIndex m, int32_t token) {
  uint64_t x = static_cast<uint64_t>(before) ^ (static_cast<uint64_t>(token) + 1) ^ (static_cast<uint64_t>(m) << 40);
  x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ULL;
  return static_cast<int64_t>((x ^ (x >> 29)) >> 1);
}

class Fuzzer {
 public:
  Fuzzer(int32_t num_pages, int32_t target_block, std::vector<int64_t> bytes, uint64_t seed, bool caching)
      : bm_(make_manager(num_pages, target_block, std::move(bytes), 1, caching)), rng_(seed), caching_(caching) {
    for (ModelIndex m = 0; m < bm_->num_models(); ++m)
      storage_.emplace_back(static_cast<std::size_t>(bm_->num_pages()) * bm_->block_size(m), 0);
  }

  void run(int ops) {
    for (int i = 0; i < ops && !::testing::Test::HasFatalFailure(); ++i) {
      step();
      if (::testing::Test::HasFailure()) {
        ADD_FAILURE() << "first failure at operation " << i;
        return;
      }
      check_global(i % 64 == 0);
    }
  }

  int64_t ops_ok() const { return ops_ok_; }
  int64_t out_of_pages() const { return out_of_pages_; }
  int64_t copies() const { return copies_; }
  int64_t matched_blocks() const { return matched_blocks_; }
  int64_t evictions() const { return bm_->prefix_cache_stats().evictions; }

 private:
  int rand_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  SeqId pick() {
    auto it = ref_.begin();
    std::advance(it, rand_int(0, static_cast<int>(ref_.size()) - 1));
    return it->first;
  }
  ModelIndex pick_model() { return rand_int(0, bm_->num_models() - 1); }
  int32_t bs(ModelIndex m) const { return bm_->block_size(m); }

  void step() {
    const int r = rand_int(0, 99);
    if (ref_.empty() || (r < 8 && ref_.size() < 12)) return caching_ && r % 2 == 0 ? do_add_matching() : do_add();
    if (r < 12) return do_free(pick());
    if (caching_ && r >= 93 && r < 97) return do_cache(pick(), pick_model());
    if (r < 18) return do_fork(pick());
    if (r < 50) return do_reserve(pick(), pick_model());
    if (r < 75) return do_commit(pick(), pick_model());
    if (r < 85) return do_rollback(pick(), pick_model());
    if (r < 93) return do_reserve_batch(pick_model());
    return do_commit_batch(pick_model());
  }

  // References to each page from live block tables, as the reference model sees them.
  std::map<int32_t, int> page_refs() const {
    std::map<int32_t, int> refs;
    for (const auto& [id, unused] : ref_)
      for (ModelIndex m = 0; m < bm_->num_models(); ++m)
        for (int32_t p : pages_of(*bm_, id, m)) ++refs[p];
    return refs;
  }

  // Pages a reservation of n slots needs: new pages, plus a copy when it writes into a page
  // shared with other sequences (that page is recorded in *cow_page, else -1).
  int64_t pages_needed(SeqId id, ModelIndex m, int32_t n, const std::map<int32_t, int>& refs,
                       int32_t* cow_page) const {
    const int64_t c = static_cast<int64_t>(ref_.at(id)[static_cast<std::size_t>(m)].tokens.size());
    const int64_t b = bs(m);
    int64_t need = std::max<int64_t>(0, (c + n + b - 1) / b - (c + b - 1) / b);
    *cow_page = -1;
    if (n > 0 && c % b != 0 && refs.at(pages_of(*bm_, id, m).back()) > 1) {
      *cow_page = pages_of(*bm_, id, m).back();
      ++need;
    }
    return need;
  }

  void do_add() {
    const SeqId id = next_id_++;
    SPECD_ASSERT_OK(bm_->add_sequence(id));
    ref_[id].resize(static_cast<std::size_t>(bm_->num_models()));
    ++ops_ok_;
  }

  // A new sequence whose tokens start like an earlier sequence's adopts its cached prefix.
  void do_add_matching() {
    const SeqId id = next_id_++;
    SPECD_ASSERT_OK(bm_->add_sequence(id));
    std::vector<ModelRef>& refs = ref_[id];
    refs.resize(static_cast<std::size_t>(bm_->num_models()));
    std::vector<int32_t> tokens;
    if (!corpus_.empty()) tokens = corpus_[static_cast<std::size_t>(rand_int(0, static_cast<int>(corpus_.size()) - 1))];
    tokens.resize(static_cast<std::size_t>(rand_int(0, static_cast<int>(tokens.size()))));
    for (int i = rand_int(0, 6); i > 0; --i) tokens.push_back(rand_int(0, 1));
    for (ModelIndex m = 0; m < bm_->num_models(); ++m) {
      const int64_t limit = rand_int(0, static_cast<int>(tokens.size()) + 2);
      int64_t matched = -1;
      SPECD_ASSERT_OK(bm_->match_prefix(id, m, tokens, limit, &matched));
      ASSERT_EQ(matched % bs(m), 0);
      ASSERT_LE(matched, std::min<int64_t>(limit, static_cast<int64_t>(tokens.size())));
      ModelRef& mr = refs[static_cast<std::size_t>(m)];
      mr.stream.assign(tokens.begin(), tokens.begin() + matched);
      for (int32_t t : mr.stream) mr.tokens.push_back(kv_value(mr.tokens.empty() ? 0 : mr.tokens.back(), m, t));
      matched_blocks_ += matched / bs(m);
      int64_t again = -1;  // a second match into a sequence with KV is refused
      if (matched > 0) SPECD_EXPECT_CODE(bm_->match_prefix(id, m, tokens, limit, &again), kFailedPrecondition);
    }
    verify_contents(id);  // each adopted position holds the value of its own token prefix
    ++ops_ok_;
  }

  void do_cache(SeqId id, ModelIndex m) {
    const ModelRef& mr = ref_[id][static_cast<std::size_t>(m)];
    std::vector<int32_t> committed(mr.stream.begin(), mr.stream.begin() + static_cast<std::ptrdiff_t>(mr.tokens.size()));
    SPECD_ASSERT_OK(bm_->cache_blocks(id, m, committed));
    if (committed.size() >= 4) corpus_.push_back(committed);
    if (corpus_.size() > 64) corpus_.erase(corpus_.begin());
    ++ops_ok_;
  }

  void do_free(SeqId id) {
    if (caching_ && rand_int(0, 1) == 0) do_cache(id, pick_model());
    SPECD_ASSERT_OK(bm_->free_sequence(id));
    ref_.erase(id);
    ++ops_ok_;
  }

  void do_fork(SeqId parent) {
    const SeqId child = next_id_++;
    bool pending = false;
    for (const ModelRef& mr : ref_[parent]) pending |= !mr.pending.empty();
    const int32_t used = bm_->num_used_pages();
    const Status s = bm_->fork(parent, child);
    if (pending) {
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
      EXPECT_FALSE(bm_->contains(child));
      EXPECT_EQ(bm_->num_used_pages(), used);
      return;
    }
    SPECD_ASSERT_OK(s);
    EXPECT_EQ(bm_->num_used_pages(), used);  // sharing allocates nothing
    ref_[child] = ref_[parent];
    verify_contents(child);
    ++ops_ok_;
  }

  void apply_reservation(const Reservation& r) {
    for (const PageCopy& c : r.copies) {
      std::vector<int64_t>& st = storage_[static_cast<std::size_t>(c.model)];
      const int64_t b = bs(c.model);
      for (int32_t i = 0; i < c.num_tokens; ++i)
        st[static_cast<std::size_t>(c.dst_page * b + i)] = st[static_cast<std::size_t>(c.src_page * b + i)];
      ++copies_;
    }
  }

  // Writes fresh values into `slots` for (id, m) and checks no other live sequence uses them.
  void write_reserved(SeqId id, ModelIndex m, const int64_t* slots, int32_t n) {
    ModelRef& mr = ref_[id][static_cast<std::size_t>(m)];
    std::set<int64_t> mine(slots, slots + n);
    EXPECT_EQ(mine.size(), static_cast<std::size_t>(n)) << "duplicate slots in one reservation";
    for (const auto& [other, refs] : ref_) {
      if (other == id) continue;
      const auto& omr = refs[static_cast<std::size_t>(m)];
      std::vector<int64_t> os;
      SPECD_ASSERT_OK(bm_->slots(other, m, 0, static_cast<int64_t>(omr.tokens.size() + omr.pending.size()), &os));
      for (int64_t s : os) ASSERT_EQ(mine.count(s), 0u) << "slot " << s << " of seq " << id
                                                        << " also belongs to seq " << other;
    }
    mr.pending.clear();
    mr.stream.resize(mr.tokens.size());
    for (int32_t i = 0; i < n; ++i) {
      int64_t value = next_value_++;
      if (caching_) {
        mr.stream.push_back(rand_int(0, 1));
        const int64_t before = i > 0 ? mr.pending.back() : mr.tokens.empty() ? 0 : mr.tokens.back();
        value = kv_value(before, m, mr.stream.back());
      }
      mr.pending.push_back(value);
      storage_[static_cast<std::size_t>(m)][static_cast<std::size_t>(slots[i])] = value;
    }
  }

  void do_reserve(SeqId id, ModelIndex m) {
    const int32_t n = rand_int(0, 3 * bs(m)) - (rand_int(0, 40) == 0 ? 3 * bs(m) + 1 : 0);
    reserve_and_check(m, {id}, {n}, /*batched=*/false);
  }

  void do_reserve_batch(ModelIndex m) {
    std::vector<SeqId> ids;
    std::vector<int32_t> ns;
    for (const auto& [id, unused] : ref_)
      if (rand_int(0, 2) == 0) {
        ids.push_back(id);
        ns.push_back(rand_int(0, 2 * bs(m)));
      }
    reserve_and_check(m, ids, ns, /*batched=*/true);
  }

  // Reserves ns[i] slots for ids[i] (reserve_batch, or reserve for a single id) and checks
  // the status against the reference's prediction: the first sequence (in order) with a
  // negative n or a pending reservation decides the error, then the page count.
  void reserve_and_check(ModelIndex m, const std::vector<SeqId>& ids,
                         const std::vector<int32_t>& ns, bool batched) {
    const auto refs = page_refs();
    StatusCode want = StatusCode::kOk;
    int64_t needed = 0;
    std::map<int32_t, int> writers;  // shared page -> sequences of this call that copy it
    for (std::size_t i = 0; i < ids.size() && want == StatusCode::kOk; ++i) {
      int32_t cow_page = -1;
      if (ns[i] < 0) want = StatusCode::kInvalidArgument;
      else if (!ref_[ids[i]][static_cast<std::size_t>(m)].pending.empty()) want = StatusCode::kFailedPrecondition;
      else needed += pages_needed(ids[i], m, ns[i], refs, &cow_page);
      if (cow_page >= 0) ++writers[cow_page];
    }
    // All r sharers of a page writing into it need only r - 1 copies: the last keeps it.
    for (const auto& [page, count] : writers) needed -= std::max(0, count - (refs.at(page) - 1));
    const int32_t free_before = bm_->num_free_pages();
    if (want == StatusCode::kOk && needed > free_before) want = StatusCode::kOutOfPages;
    Reservation r;
    const Status s = batched ? bm_->reserve_batch(m, ids, ns, &r) : bm_->reserve(ids[0], m, ns[0], &r);
    ASSERT_EQ(s.code(), want) << s.to_string();
    if (want == StatusCode::kOutOfPages) ++out_of_pages_;
    if (!s.ok()) {
      EXPECT_EQ(bm_->num_free_pages(), free_before);  // failures change nothing
      for (SeqId id : ids) verify_contents(id);
      return;
    }
    EXPECT_EQ(free_before - bm_->num_free_pages(), needed);
    apply_reservation(r);
    std::size_t offset = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      write_reserved(ids[i], m, r.slots.data() + offset, ns[i]);
      offset += static_cast<std::size_t>(ns[i]);
      verify_contents(ids[i]);
    }
    EXPECT_EQ(offset, r.slots.size());
    ++ops_ok_;
  }

  void do_commit(SeqId id, ModelIndex m) {
    ModelRef& mr = ref_[id][static_cast<std::size_t>(m)];
    const int32_t a = rand_int(0, static_cast<int32_t>(mr.pending.size()) + 1);
    const Status s = bm_->commit(id, m, a);
    if (a > static_cast<int32_t>(mr.pending.size())) {
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
      return;
    }
    SPECD_ASSERT_OK(s);
    mr.tokens.insert(mr.tokens.end(), mr.pending.begin(), mr.pending.begin() + a);
    mr.pending.clear();
    mr.stream.resize(mr.tokens.size());
    verify_contents(id);
    ++ops_ok_;
  }

  void do_commit_batch(ModelIndex m) {
    std::vector<SeqId> ids;
    std::vector<int32_t> as;
    bool too_many = false;
    for (auto& [id, refs] : ref_)
      if (rand_int(0, 1) == 0) {
        const auto reserved = static_cast<int32_t>(refs[static_cast<std::size_t>(m)].pending.size());
        ids.push_back(id);
        as.push_back(rand_int(0, reserved + (rand_int(0, 20) == 0 ? 1 : 0)));
        too_many |= as.back() > reserved;
      }
    const Status s = bm_->commit_batch(m, ids, as);
    if (too_many) {
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
      return;
    }
    SPECD_ASSERT_OK(s);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ModelRef& mr = ref_[ids[i]][static_cast<std::size_t>(m)];
      mr.tokens.insert(mr.tokens.end(), mr.pending.begin(), mr.pending.begin() + as[i]);
      mr.pending.clear();
      mr.stream.resize(mr.tokens.size());
      verify_contents(ids[i]);
    }
    ++ops_ok_;
  }

  void do_rollback(SeqId id, ModelIndex m) {
    ModelRef& mr = ref_[id][static_cast<std::size_t>(m)];
    const auto len = static_cast<int64_t>(mr.tokens.size());
    const int64_t new_len = rand_int(0, 4) == 0 ? len + 1 : rand_int(0, static_cast<int>(len));
    const Status s = bm_->rollback(id, m, new_len);
    if (new_len > len) {
      EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.to_string();
      return;
    }
    SPECD_ASSERT_OK(s);
    mr.tokens.resize(static_cast<std::size_t>(new_len));
    mr.pending.clear();
    mr.stream.resize(mr.tokens.size());
    verify_contents(id);
    ++ops_ok_;
  }

  // The sequence reads back, through its slots, exactly the values it committed and reserved.
  void verify_contents(SeqId id) {
    for (ModelIndex m = 0; m < bm_->num_models(); ++m) {
      const ModelRef& mr = ref_[id][static_cast<std::size_t>(m)];
      const SeqKvInfo info = info_of(*bm_, id, m);
      ASSERT_EQ(info.committed, static_cast<int64_t>(mr.tokens.size()));
      ASSERT_EQ(info.reserved, static_cast<int32_t>(mr.pending.size()));
      std::vector<int64_t> slots;
      SPECD_ASSERT_OK(bm_->slots(id, m, 0, info.committed + info.reserved, &slots));
      for (std::size_t p = 0; p < slots.size(); ++p) {
        const int64_t want = p < mr.tokens.size() ? mr.tokens[p] : mr.pending[p - mr.tokens.size()];
        ASSERT_EQ(storage_[static_cast<std::size_t>(m)][static_cast<std::size_t>(slots[p])], want)
            << "sequence " << id << " model " << m << " position " << p << " slot " << slots[p];
      }
    }
  }

  void check_global(bool contents) {
    SPECD_ASSERT_OK(bm_->check_invariants());
    const auto refs = page_refs();
    ASSERT_EQ(bm_->num_free_pages(), bm_->num_pages() - static_cast<int32_t>(refs.size()));
    ASSERT_EQ(bm_->num_sequences(), static_cast<int64_t>(ref_.size()));
    if (contents)
      for (const auto& [id, unused] : ref_) verify_contents(id);
  }

  std::unique_ptr<BlockManager> bm_;
  std::mt19937_64 rng_;
  bool caching_;
  std::vector<std::vector<int32_t>> corpus_;  // token streams registered lately (prefix caching)
  int64_t matched_blocks_ = 0;
  std::map<SeqId, std::vector<ModelRef>> ref_;
  std::vector<std::vector<int64_t>> storage_;  // per model: value written at each slot
  SeqId next_id_ = 100;
  int64_t next_value_ = 1;
  int64_t ops_ok_ = 0, out_of_pages_ = 0, copies_ = 0;
};

struct FuzzCase {
  const char* name;
  int32_t num_pages;
  int32_t target_block;
  std::vector<int64_t> bytes_per_token;
  uint64_t seed;
  int ops;
  bool prefix_caching = false;
};

void PrintTo(const FuzzCase& c, std::ostream* os) { *os << c.name; }

class BlockManagerFuzz : public ::testing::TestWithParam<FuzzCase> {};

TEST_P(BlockManagerFuzz, RandomOperationsMatchReference) {
  const FuzzCase& c = GetParam();
  Fuzzer f(c.num_pages, c.target_block, c.bytes_per_token, c.seed, c.prefix_caching);
  f.run(c.ops);
  std::printf("[ fuzz     ] %s: %lld ops succeeded, %lld out-of-pages answers, %lld copy-on-write copies, "
              "%lld blocks matched, %lld evictions\n",
              c.name, static_cast<long long>(f.ops_ok()), static_cast<long long>(f.out_of_pages()),
              static_cast<long long>(f.copies()), static_cast<long long>(f.matched_blocks()),
              static_cast<long long>(f.evictions()));
  // The run must have exercised the interesting paths, not just failed early.
  EXPECT_GT(f.ops_ok(), c.ops / 3);
  EXPECT_GT(f.out_of_pages(), 0);
  EXPECT_GT(f.copies(), 0);
  if (c.prefix_caching) {
    EXPECT_GT(f.matched_blocks(), 0);
    EXPECT_GT(f.evictions(), 0);
  }
}

// 7 cases x 30,000 operations = 210,000 random operations.
INSTANTIATE_TEST_SUITE_P(
    Pools, BlockManagerFuzz,
    ::testing::Values(FuzzCase{"TinyPool", 16, 4, {6}, 1, 30000},          // constant pressure
                      FuzzCase{"TargetAndDraft", 24, 4, {6, 4}, 2, 30000},  // 4 + 6 tokens/page
                      FuzzCase{"ThreeModels", 40, 8, {6, 5, 3}, 3, 30000},  // uneven blocks
                      FuzzCase{"OneTokenBlocks", 12, 1, {6, 2}, 4, 30000},  // target block of 1
                      FuzzCase{"PrefixCaching", 24, 4, {6}, 5, 30000, true},
                      FuzzCase{"PrefixCachingTargetAndDraft", 32, 4, {6, 4}, 6, 30000, true},
                      FuzzCase{"PrefixCachingOneTokenBlocks", 12, 1, {6, 2}, 7, 30000, true}),
    [](const ::testing::TestParamInfo<FuzzCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace specd::testing
