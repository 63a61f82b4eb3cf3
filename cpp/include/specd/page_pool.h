// PagePool: the fixed set of KV pages [0, num_pages) shared by every model and sequence,
// with a reference count per page and, for prefix caching, an LRU list of cached pages that
// no sequence references.
//
// Rules
// - A page is in one of three states:
//   - free: refcount 0, on the free list;
//   - used: refcount >= 1 (block tables name it);
//   - evictable: refcount 0 but marked cached (its KV is registered in a PrefixCache), on
//     the LRU list, oldest release first. Its KV stays valid until it is evicted.
// - allocate() takes a free page if there is one, else evicts the least recently released
//   evictable page (reported through `evicted` so the caller forgets its cache entry); the
//   page gets refcount 1 and is no longer cached. It fails (returns false) only when no page
//   is free or evictable.
// - retain() adds a reference to a used page, or revives an evictable one (a cache hit: it
//   leaves the LRU list with refcount 1 and stays cached). release() drops one reference;
//   at 0 the page becomes evictable if cached, else free.
// - set_cached() marks or unmarks a page; unmarking an evictable page frees it.
// - Capacity: num_free() counts free and evictable pages (both can be allocated), so
//   num_free() + num_used() == num_pages() at all times, whatever is cached.
// - The pool trusts its caller (BlockManager validates every request before touching it);
//   misuse such as releasing a free page is caught by assertions in debug builds and by
//   check_invariants().
// - All operations are O(1). Not thread-safe: one scheduler thread owns the pool.
#pragma once

#include <cstdint>
#include <vector>

#include "specd/status.h"

namespace specd {

class PagePool {
 public:
  explicit PagePool(int32_t num_pages);

  int32_t num_pages() const { return static_cast<int32_t>(refcount_.size()); }
  // Pages that allocate() can hand out: free plus evictable.
  int32_t num_free() const { return static_cast<int32_t>(free_.size()) + num_evictable_; }
  int32_t num_used() const { return num_pages() - num_free(); }
  int32_t num_evictable() const { return num_evictable_; }
  int32_t refcount(int32_t page) const { return refcount_[static_cast<std::size_t>(page)]; }
  bool cached(int32_t page) const { return cached_[static_cast<std::size_t>(page)] != 0; }

  // Takes a free page, else evicts the oldest evictable one (*evicted = its id; -1 when the
  // page came from the free list). The page gets refcount 1 and is not cached. Returns false,
  // changing nothing, when no page is free or evictable.
  bool allocate(int32_t* page, int32_t* evicted = nullptr);
  // Adds a reference to a used page, or revives an evictable page (refcount 1, still cached).
  void retain(int32_t page);
  // Drops a reference; returns true when the refcount reached 0 (the page is then evictable
  // if cached, else free).
  bool release(int32_t page);
  // Marks a used or evictable page cached or not (an evictable page unmarked becomes free).
  void set_cached(int32_t page, bool cached);

  // Checks that the free list holds exactly the uncached pages of refcount 0, each once, and
  // the LRU list exactly the cached pages of refcount 0.
  Status check_invariants() const;

 private:
  void lru_push_back(int32_t page);
  void lru_remove(int32_t page);

  std::vector<int32_t> refcount_;  // [num_pages]
  std::vector<int32_t> free_;      // stack of free page ids; the next allocation is back()
  std::vector<char> cached_;       // [num_pages]
  // The LRU list of evictable pages, intrusive (prev/next page ids, -1 at the ends).
  std::vector<int32_t> lru_prev_, lru_next_;  // [num_pages]
  int32_t lru_head_ = -1, lru_tail_ = -1;     // head: evicted first
  int32_t num_evictable_ = 0;
};

}  // namespace specd
