#include "specd/page_pool.h"

#include <cassert>

namespace specd {

PagePool::PagePool(int32_t num_pages)
    : refcount_(static_cast<std::size_t>(num_pages > 0 ? num_pages : 0), 0) {
  free_.reserve(refcount_.size());
  // Lowest page ids are handed out first (makes worked examples and debugging readable).
  for (int32_t p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

bool PagePool::allocate(int32_t* page) {
  if (free_.empty()) return false;
  *page = free_.back();
  free_.pop_back();
  assert(refcount_[static_cast<std::size_t>(*page)] == 0);
  refcount_[static_cast<std::size_t>(*page)] = 1;
  return true;
}

void PagePool::retain(int32_t page) {
  assert(page >= 0 && page < num_pages() && refcount_[static_cast<std::size_t>(page)] > 0);
  ++refcount_[static_cast<std::size_t>(page)];
}

bool PagePool::release(int32_t page) {
  assert(page >= 0 && page < num_pages() && refcount_[static_cast<std::size_t>(page)] > 0);
  if (--refcount_[static_cast<std::size_t>(page)] > 0) return false;
  free_.push_back(page);
  return true;
}

Status PagePool::check_invariants() const {
  std::vector<char> on_free_list(refcount_.size(), 0);
  for (int32_t p : free_) {
    if (p < 0 || p >= num_pages())
      return error_status(StatusCode::kInternal, "free list holds invalid page ", p);
    if (on_free_list[static_cast<std::size_t>(p)])
      return error_status(StatusCode::kInternal, "page ", p, " is on the free list twice");
    on_free_list[static_cast<std::size_t>(p)] = 1;
  }
  for (std::size_t p = 0; p < refcount_.size(); ++p) {
    const bool is_free = refcount_[p] == 0;
    if (refcount_[p] < 0)
      return error_status(StatusCode::kInternal, "page ", p, " has refcount ", refcount_[p]);
    if (is_free != static_cast<bool>(on_free_list[p]))
      return error_status(StatusCode::kInternal, "page ", p, " has refcount ", refcount_[p],
                          is_free ? " but is not on the free list" : " but is on the free list");
  }
  return Status::Ok();
}

}  // namespace specd
