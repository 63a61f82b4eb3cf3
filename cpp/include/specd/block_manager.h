// BlockManager: paged KV-cache allocator for speculative decoding, for one or more models
// (target, draft, ...) sharing one pool of pages.
//
// Words (see docs/architecture.md)
// - page: a fixed number of bytes of KV memory, identified by a page id in [0, num_pages).
// - block: a page as seen by one model; it holds block_size(m) = page_bytes /
//   kv_bytes_per_token(m) tokens (rounded down to a multiple of block_align), so a draft model
//   with smaller per-token KV fits more tokens per page. A page belongs to one model at a time.
// - slot: where one token's KV lives for model m: slot = page * block_size(m) + offset.
// - committed length c: tokens [0, c) of the sequence have KV that is part of the sequence.
// - lookahead slots: n slots reserved for positions [c, c + n) before a forward pass writes
//   them (draft tokens, or the prompt during prefill); they may cross block boundaries.
//
// Rules (all ranges half-open)
// - Each sequence has, per model, a block table `pages` covering exactly the positions
//   [0, c + r), where r is the number of reserved slots: pages.size() == ceil((c + r) / bs).
// - reserve(seq, m, n) requires r == 0 (commit or roll back first); it returns the slots of
//   positions [c, c + n), allocating pages as needed. If the page holding position c is shared
//   with another sequence (after fork), it is first copied (copy-on-write): the new page
//   replaces it in this sequence's table and the copy to perform is returned; perform it
//   before writing the slots. Pages that hold reserved slots are never shared.
// - commit(seq, m, a) requires 0 <= a <= r: positions [c, c + a) become committed, the other
//   r - a reserved slots are dropped and pages no longer needed are freed at once.
// - rollback(seq, m, L) requires 0 <= L <= c: drops every position >= L (committed or
//   reserved) and frees pages no longer needed. rollback(seq, m, c) cancels a reservation.
// - fork(parent, child) requires no reserved slots in the parent: the child shares the
//   parent's pages for its committed positions of every model (reference counts), and later
//   writes into a shared page copy it first.
// - Capacity: pages are the only currency, shared by all models; a call that needs more pages
//   than are free returns kOutOfPages and changes nothing (recoverable: the scheduler
//   preempts). So memory is never over-committed, whatever mix of target and draft KV.
// - Every failed call returns a Status with a message and leaves the manager unchanged.
// - Prefix caching (config.prefix_caching; off: the calls below do nothing and match
//   nothing): full committed blocks are registered in a PrefixCache (prefix_cache.h) under
//   their tokens and everything before them, by cache_blocks(seq, m, tokens); a new sequence
//   adopts the pages of the longest registered prefix of its tokens by match_prefix()
//   (reference counts, as fork). A registered page that no sequence references stays in the
//   pool, evictable (page_pool.h): it counts as free, and allocation evicts the least
//   recently released one when no page is truly free, so caching never costs capacity. A
//   sequence writing into a registered page (after a rollback into it) first copies it if
//   it is shared, else unregisters it, so a registered page's KV never changes. The caller
//   vouches that `tokens` are the sequence's tokens (their KV is what its pages hold).
// - Cost: reserve/commit/rollback are O(n / bs + 1) (the slots touched), independent of the
//   sequence's length; fork and free are O(pages of the sequence); exports are O(pages out);
//   match_prefix and cache_blocks are O(tokens matched or registered).
// - Not thread-safe: one scheduler thread owns a BlockManager.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "specd/page_pool.h"
#include "specd/prefix_cache.h"
#include "specd/span.h"
#include "specd/status.h"

namespace specd {

using SeqId = int64_t;      // chosen by the caller (a request id); any value
using ModelIndex = int32_t; // index into BlockManagerConfig::models; 0 is the target by convention

struct ModelKvSpec {
  std::string name;            // "target", "draft", ... (unique)
  int64_t kv_bytes_per_token;  // K and V of one token over all layers of this model, in bytes
};

struct BlockManagerConfig {
  int64_t page_bytes = 0;          // bytes of one page (> 0)
  int32_t num_pages = 0;           // pages in the pool (> 0)
  std::vector<ModelKvSpec> models; // 1..kMaxModels models; their index is their ModelIndex
  int32_t block_align = 1;         // tokens per block are rounded down to a multiple of this
  bool prefix_caching = false;     // register full blocks for reuse by later sequences
};

// A copy the caller must perform (for model `model`) before writing reserved slots:
// the first `num_tokens` token slots of page `src_page` into page `dst_page`.
struct PageCopy {
  ModelIndex model;
  int32_t src_page;
  int32_t dst_page;
  int32_t num_tokens;
};

// Result of reserve / reserve_batch. Reused across calls to avoid allocation (cleared first).
struct Reservation {
  std::vector<int64_t> slots;    // [total reserved] slots of the reserved positions, in order
  std::vector<PageCopy> copies;  // copy-on-write copies to perform before writing the slots
};

// Block tables of several sequences for one model in CSR form (flashinfer's paged layout):
// pages of sequence i are indices[indptr[i] : indptr[i+1]]; last_page_len[i] is how many
// tokens its last page holds (1..block_size), 0 when it has no page. The KV extent described
// is [0, c + r): committed plus reserved positions, which is what a forward that writes the
// reserved slots attends over.
struct BlockTableCsr {
  std::vector<int32_t> indptr;         // [num_seqs + 1]
  std::vector<int32_t> indices;        // [indptr[num_seqs]] page ids
  std::vector<int32_t> last_page_len;  // [num_seqs]
};

// Per-sequence, per-model lengths.
struct SeqKvInfo {
  int64_t committed = 0;  // c
  int32_t reserved = 0;   // r
  int32_t num_pages = 0;  // ceil((c + r) / block_size)
};

// Prefix-cache figures of a BlockManager.
struct PrefixCacheStats {
  int64_t cached_pages = 0;     // pages registered (used or evictable)
  int32_t evictable_pages = 0;  // registered pages no sequence references
  int64_t evictions = 0;        // registered pages taken by allocation (since creation or reset)
  int64_t hit_pages = 0;        // pages adopted by match_prefix (since creation or reset; each
                                // call counts, also one whose admission is then undone)
};

class BlockManager {
 public:
  static constexpr int kMaxModels = 8;

  // Validates `config` (positive sizes, unique names, every model fits >= 1 token per page).
  static Status create(const BlockManagerConfig& config, std::unique_ptr<BlockManager>* out);

  // ---- pool and models ----
  int32_t num_models() const { return static_cast<int32_t>(models_.size()); }
  const ModelKvSpec& model(ModelIndex m) const { return models_[static_cast<std::size_t>(m)].spec; }
  int32_t block_size(ModelIndex m) const { return models_[static_cast<std::size_t>(m)].block_size; }
  // Index of the model called `name`, or -1.
  ModelIndex model_index(const std::string& name) const;
  int64_t page_bytes() const { return page_bytes_; }
  int32_t num_pages() const { return pool_.num_pages(); }
  int32_t num_free_pages() const { return pool_.num_free(); }
  int32_t num_used_pages() const { return pool_.num_used(); }
  int32_t page_refcount(int32_t page) const { return pool_.refcount(page); }
  bool prefix_caching() const { return prefix_caching_; }
  PrefixCacheStats prefix_cache_stats() const;

  // Pages a sequence needs to hold `num_tokens` tokens of model m: ceil(num_tokens / bs).
  int64_t pages_for_tokens(ModelIndex m, int64_t num_tokens) const;
  // Admission check: can a new sequence that must hold tokens_per_model[m] tokens of each
  // model be given its pages now, leaving at least `headroom_pages` free?
  bool can_admit(Span<const int64_t> tokens_per_model, int64_t headroom_pages = 0) const;

  // ---- sequences ----
  // Adds an empty sequence (length 0 for every model).
  Status add_sequence(SeqId seq);
  // Frees every page the sequence references and forgets it (sequence end or preemption).
  Status free_sequence(SeqId seq);
  // See the rules above. The child must not exist; the parent must have no reserved slots.
  Status fork(SeqId parent, SeqId child);
  bool contains(SeqId seq) const { return seqs_.count(seq) != 0; }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  Status info(SeqId seq, ModelIndex m, SeqKvInfo* out) const;
  // The sequence's block table for model m (valid until the next mutating call).
  Status pages(SeqId seq, ModelIndex m, const std::vector<int32_t>** out) const;
  // Slots of positions [p0, p1) of the sequence (p1 <= c + r).
  Status slots(SeqId seq, ModelIndex m, int64_t p0, int64_t p1, std::vector<int64_t>* out) const;

  // ---- prefix caching (rules above) ----
  // For a sequence with no KV for model m (c == r == 0): adopts the pages of the longest
  // registered prefix of `tokens`, whole blocks of at most `max_tokens` tokens, and sets
  // c to its length, returned in *matched (0 when nothing matches or caching is off).
  Status match_prefix(SeqId seq, ModelIndex m, Span<const int32_t> tokens, int64_t max_tokens,
                      int64_t* matched);
  // What match_prefix would adopt for `tokens` now (tokens; 0 when nothing matches, caching is
  // off or m is not a model), without adopting anything. O(tokens matched).
  int64_t cached_prefix(ModelIndex m, Span<const int32_t> tokens, int64_t max_tokens) const;
  // Registers the sequence's full committed blocks of model m not registered yet, those
  // within [0, min(c, tokens.size())); `tokens` are the sequence's tokens from position 0.
  // Stops at a block whose page holds another key. O(blocks registered) plus O(1).
  Status cache_blocks(SeqId seq, ModelIndex m, Span<const int32_t> tokens);
  // Forgets every registered block (evictable pages become free; sequences register their
  // blocks again on their next cache_blocks) and zeroes the eviction and hit counts. For
  // benchmarks, tests and a fresh start. O(pages + sequences).
  void reset_prefix_cache();

  // ---- lookahead: reserve, commit, rollback ----
  Status reserve(SeqId seq, ModelIndex m, int32_t n, Reservation* out);
  Status commit(SeqId seq, ModelIndex m, int32_t num_accepted);
  Status rollback(SeqId seq, ModelIndex m, int64_t new_len);

  // Batched forms for one engine step (one call instead of one per sequence). All or nothing:
  // every sequence is validated (and, for reserve, the pages of all of them counted) before
  // anything changes. Sequences must be distinct. reserve_batch concatenates the slots in the
  // order of `seqs`; its page count is exact: when s forked siblings in the batch write into
  // the same shared page of refcount r, min(s, r - 1) copies are made (the last writer keeps
  // the original page), so a batch is refused only if it truly does not fit.
  Status reserve_batch(ModelIndex m, Span<const SeqId> seqs, Span<const int32_t> n,
                       Reservation* out);
  Status commit_batch(ModelIndex m, Span<const SeqId> seqs, Span<const int32_t> num_accepted);

  // ---- block-table export for attention kernels (model m, sequences in the given order) ----
  Status export_csr(ModelIndex m, Span<const SeqId> seqs, BlockTableCsr* out) const;
  // Row-major [num_seqs, width] table; entries past a sequence's pages are `pad`. width <= 0
  // means the largest page count among `seqs`; a sequence with more pages than width fails.
  Status export_padded(ModelIndex m, Span<const SeqId> seqs, int32_t width, int32_t pad,
                       std::vector<int32_t>* out, int32_t* out_width) const;
  // [num_seqs] KV extent c + r of each sequence (the attention length of the next forward).
  Status export_kv_lens(ModelIndex m, Span<const SeqId> seqs, std::vector<int32_t>* out) const;

  // ---- debugging ----
  // Full consistency check, O(pages + sequences): every used page's refcount equals the
  // number of block-table entries naming it, free pages are referenced by none, each page
  // serves a single model, table sizes match lengths, pages holding reserved slots are not
  // shared nor registered, the pool's cached pages are the prefix cache's, and each
  // sequence's registered chain covers only full committed blocks. Tests run it after every
  // operation.
  Status check_invariants() const;

 private:
  struct ModelState {
    ModelKvSpec spec;
    int32_t block_size;
  };
  struct SeqModelState {
    std::vector<int32_t> pages;  // block table
    std::vector<uint64_t> block_keys;  // prefix-cache key ids of its first full blocks
    int64_t committed = 0;
    int32_t reserved = 0;
  };
  struct Sequence {
    std::vector<SeqModelState> models;  // [num_models]
    uint64_t batch_mark = 0;            // duplicate detection in batched calls
  };
  struct ReservePlan {
    Sequence* seq;
    int32_t n;
    int64_t pages_needed;  // new pages + copy-on-write page
    int32_t cow_page;      // the shared page it would copy, or -1
  };

  BlockManager(std::vector<ModelState> models, int64_t page_bytes, int32_t num_pages,
               bool prefix_caching);

  Status find(SeqId seq, Sequence** out);
  Status find(SeqId seq, const Sequence** out) const;
  Status check_model(ModelIndex m) const;
  // The registered blocks (key, page) of the longest cached prefix of `tokens`, whole blocks
  // of at most max_tokens tokens (match_prefix, cached_prefix).
  std::vector<std::pair<uint64_t, int32_t>> matched_blocks(ModelIndex m, Span<const int32_t> tokens,
                                                           int64_t max_tokens) const;
  Status plan_reserve(SeqId id, Sequence* seq, ModelIndex m, int32_t n, ReservePlan* plan) const;
  void apply_reserve(const ReservePlan& plan, ModelIndex m, Reservation* out);
  int64_t copies_spared_in_batch();
  Status check_commit(SeqId id, const Sequence& seq, ModelIndex m, int32_t num_accepted) const;
  // Sets the sequence's length for model m to `len` (no reservation) and frees surplus pages.
  void truncate(SeqModelState* st, ModelIndex m, int64_t len);
  Status out_of_pages(const char* what, int64_t needed) const;
  // pool_.allocate that also forgets an evicted page's cache entry (the caller counted it).
  int32_t take_page();
  // A sequence is about to write into `page` (its own, refcount 1): unregister it.
  void unregister(int32_t page);

  std::vector<ModelState> models_;
  int64_t page_bytes_;
  PagePool pool_;
  bool prefix_caching_;
  PrefixCache cache_;
  int64_t evictions_ = 0;
  int64_t hit_pages_ = 0;
  std::unordered_map<SeqId, Sequence> seqs_;
  uint64_t batch_epoch_ = 0;
  std::vector<ReservePlan> plans_;      // scratch of reserve_batch (no allocation per step)
  std::vector<int32_t> cow_pages_;      // scratch of reserve_batch
  std::vector<Sequence*> batch_seqs_;   // scratch of commit_batch
};

}  // namespace specd
