// PagePool: the fixed set of KV pages [0, num_pages) shared by every model and sequence,
// with a reference count per page.
//
// Rules
// - A page is free (refcount 0, on the free list) or used (refcount >= 1).
// - allocate() takes a free page and gives it refcount 1; it fails (returns false) only when
//   no page is free. retain() adds a reference to a used page (fork / prefix sharing);
//   release() drops one and puts the page back on the free list when it reaches 0.
// - num_free() + num_used() == num_pages() at all times.
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
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_used() const { return num_pages() - num_free(); }
  int32_t refcount(int32_t page) const { return refcount_[static_cast<std::size_t>(page)]; }

  // Takes a free page (refcount becomes 1). Returns false, changing nothing, when none is free.
  bool allocate(int32_t* page);
  // Adds a reference to a used page.
  void retain(int32_t page);
  // Drops a reference; returns true when the page became free.
  bool release(int32_t page);

  // Checks that the free list holds exactly the pages of refcount 0, each once.
  Status check_invariants() const;

 private:
  std::vector<int32_t> refcount_;  // [num_pages]
  std::vector<int32_t> free_;      // stack of free page ids; the next allocation is back()
};

}  // namespace specd
