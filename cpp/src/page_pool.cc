#include "specd/page_pool.h"

#include <cassert>

namespace specd {

PagePool::PagePool(int32_t num_pages)
    : refcount_(static_cast<std::size_t>(num_pages > 0 ? num_pages : 0), 0),
      cached_(refcount_.size(), 0),
      lru_prev_(refcount_.size(), -1),
      lru_next_(refcount_.size(), -1) {
  free_.reserve(refcount_.size());
  // Lowest page ids are handed out first (makes worked examples and debugging readable).
  for (int32_t p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

void PagePool::lru_push_back(int32_t page) {
  const auto p = static_cast<std::size_t>(page);
  lru_prev_[p] = lru_tail_;
  lru_next_[p] = -1;
  if (lru_tail_ >= 0) lru_next_[static_cast<std::size_t>(lru_tail_)] = page;
  else lru_head_ = page;
  lru_tail_ = page;
  ++num_evictable_;
}

void PagePool::lru_remove(int32_t page) {
  const auto p = static_cast<std::size_t>(page);
  const int32_t prev = lru_prev_[p], next = lru_next_[p];
  if (prev >= 0) lru_next_[static_cast<std::size_t>(prev)] = next;
  else lru_head_ = next;
  if (next >= 0) lru_prev_[static_cast<std::size_t>(next)] = prev;
  else lru_tail_ = prev;
  lru_prev_[p] = lru_next_[p] = -1;
  --num_evictable_;
}

bool PagePool::allocate(int32_t* page, int32_t* evicted) {
  if (evicted != nullptr) *evicted = -1;
  if (!free_.empty()) {
    *page = free_.back();
    free_.pop_back();
  } else if (lru_head_ >= 0) {
    *page = lru_head_;
    lru_remove(*page);
    cached_[static_cast<std::size_t>(*page)] = 0;
    if (evicted != nullptr) *evicted = *page;
  } else {
    return false;
  }
  assert(refcount_[static_cast<std::size_t>(*page)] == 0);
  refcount_[static_cast<std::size_t>(*page)] = 1;
  return true;
}

void PagePool::retain(int32_t page) {
  assert(page >= 0 && page < num_pages());
  const auto p = static_cast<std::size_t>(page);
  if (refcount_[p] == 0) {  // a cache hit on an evictable page
    assert(cached_[p]);
    lru_remove(page);
  }
  ++refcount_[p];
}

bool PagePool::release(int32_t page) {
  assert(page >= 0 && page < num_pages() && refcount_[static_cast<std::size_t>(page)] > 0);
  const auto p = static_cast<std::size_t>(page);
  if (--refcount_[p] > 0) return false;
  if (cached_[p]) lru_push_back(page);
  else free_.push_back(page);
  return true;
}

void PagePool::set_cached(int32_t page, bool cached) {
  assert(page >= 0 && page < num_pages());
  const auto p = static_cast<std::size_t>(page);
  if (static_cast<bool>(cached_[p]) == cached) return;
  assert(!cached || refcount_[p] > 0);  // only a used page becomes cached
  cached_[p] = cached ? 1 : 0;
  if (!cached && refcount_[p] == 0) {
    lru_remove(page);
    free_.push_back(page);
  }
}

Status PagePool::check_invariants() const {
  std::vector<char> on_free_list(refcount_.size(), 0), on_lru(refcount_.size(), 0);
  for (int32_t p : free_) {
    if (p < 0 || p >= num_pages())
      return error_status(StatusCode::kInternal, "free list holds invalid page ", p);
    if (on_free_list[static_cast<std::size_t>(p)])
      return error_status(StatusCode::kInternal, "page ", p, " is on the free list twice");
    on_free_list[static_cast<std::size_t>(p)] = 1;
  }
  int32_t walked = 0;
  for (int32_t p = lru_head_, prev = -1; p >= 0; prev = p, p = lru_next_[static_cast<std::size_t>(p)]) {
    if (p >= num_pages() || on_lru[static_cast<std::size_t>(p)] || ++walked > num_pages())
      return error_status(StatusCode::kInternal, "LRU list is corrupt at page ", p);
    if (lru_prev_[static_cast<std::size_t>(p)] != prev)
      return error_status(StatusCode::kInternal, "LRU list links of page ", p, " disagree");
    on_lru[static_cast<std::size_t>(p)] = 1;
  }
  if (walked != num_evictable_)
    return error_status(StatusCode::kInternal, "LRU list holds ", walked, " pages but counts ",
                        num_evictable_);
  for (std::size_t p = 0; p < refcount_.size(); ++p) {
    if (refcount_[p] < 0)
      return error_status(StatusCode::kInternal, "page ", p, " has refcount ", refcount_[p]);
    const bool idle = refcount_[p] == 0;
    const bool want_free = idle && !cached_[p], want_lru = idle && cached_[p];
    if (want_free != static_cast<bool>(on_free_list[p]))
      return error_status(StatusCode::kInternal, "page ", p, " has refcount ", refcount_[p],
                          want_free ? " but is not on the free list" : " but is on the free list");
    if (want_lru != static_cast<bool>(on_lru[p]))
      return error_status(StatusCode::kInternal, "page ", p, " (refcount ", refcount_[p],
                          cached_[p] ? ", cached)" : ", not cached)",
                          want_lru ? " is not on the LRU list" : " is on the LRU list");
  }
  return Status::Ok();
}

}  // namespace specd
