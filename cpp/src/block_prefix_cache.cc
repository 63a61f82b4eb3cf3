// BlockManager: prefix caching (the rules in block_manager.h) over its PrefixCache and the
// evictable pages of its PagePool.
#include <algorithm>

#include "specd/block_manager.h"

namespace specd {

int32_t BlockManager::take_page() {
  int32_t page = -1, evicted = -1;
  pool_.allocate(&page, &evicted);
  if (evicted >= 0) {
    cache_.erase_page(evicted);
    ++evictions_;
  }
  return page;
}

void BlockManager::unregister(int32_t page) {
  if (!pool_.cached(page)) return;
  cache_.erase_page(page);
  pool_.set_cached(page, false);
}

PrefixCacheStats BlockManager::prefix_cache_stats() const {
  PrefixCacheStats s;
  s.cached_pages = cache_.size();
  s.evictable_pages = pool_.num_evictable();
  s.evictions = evictions_;
  s.hit_pages = hit_pages_;
  return s;
}

std::vector<std::pair<uint64_t, int32_t>> BlockManager::matched_blocks(ModelIndex m, Span<const int32_t> tokens,
                                                                      int64_t max_tokens) const {
  std::vector<std::pair<uint64_t, int32_t>> out;
  const auto bs = static_cast<std::size_t>(block_size(m));
  const auto limit = static_cast<std::size_t>(std::max<int64_t>(0, std::min<int64_t>(
      max_tokens, static_cast<int64_t>(tokens.size()))));
  uint64_t parent = 0;
  for (std::size_t b = 0; (b + 1) * bs <= limit; ++b) {
    int32_t page = -1;
    const uint64_t key = cache_.find(parent, m, Span<const int32_t>(tokens.data() + b * bs, bs), &page);
    if (key == 0) break;
    out.emplace_back(key, page);
    parent = key;
  }
  return out;
}

Status BlockManager::match_prefix(SeqId seq, ModelIndex m, Span<const int32_t> tokens, int64_t max_tokens,
                                  int64_t* matched) {
  *matched = 0;
  SPECD_RETURN_IF_ERROR(check_model(m));
  Sequence* s = nullptr;
  SPECD_RETURN_IF_ERROR(find(seq, &s));
  SeqModelState& st = s->models[static_cast<std::size_t>(m)];
  if (st.committed != 0 || st.reserved != 0)
    return error_status(StatusCode::kFailedPrecondition, "match_prefix: sequence ", seq, " already has ",
                        st.committed, "+", st.reserved, " tokens of KV for model '", models_[m].spec.name,
                        "'; a prefix is matched only into an empty sequence");
  if (!prefix_caching_) return Status::Ok();
  for (const auto& [key, page] : matched_blocks(m, tokens, max_tokens)) {
    pool_.retain(page);
    st.pages.push_back(page);
    st.block_keys.push_back(key);
  }
  st.committed = static_cast<int64_t>(st.pages.size()) * block_size(m);
  hit_pages_ += static_cast<int64_t>(st.pages.size());
  *matched = st.committed;
  return Status::Ok();
}

int64_t BlockManager::cached_prefix(ModelIndex m, Span<const int32_t> tokens, int64_t max_tokens) const {
  if (!prefix_caching_ || !check_model(m).ok()) return 0;
  return static_cast<int64_t>(matched_blocks(m, tokens, max_tokens).size()) * block_size(m);
}

Status BlockManager::cache_blocks(SeqId seq, ModelIndex m, Span<const int32_t> tokens) {
  SPECD_RETURN_IF_ERROR(check_model(m));
  Sequence* s = nullptr;
  SPECD_RETURN_IF_ERROR(find(seq, &s));
  if (!prefix_caching_) return Status::Ok();
  SeqModelState& st = s->models[static_cast<std::size_t>(m)];
  const auto bs = static_cast<std::size_t>(block_size(m));
  const std::size_t full =
      std::min(static_cast<std::size_t>(st.committed), tokens.size()) / bs;
  for (std::size_t b = st.block_keys.size(); b < full; ++b) {
    const uint64_t parent = b == 0 ? 0 : st.block_keys[b - 1];
    const int32_t page = st.pages[b];
    bool inserted = false;
    const uint64_t key = cache_.insert(parent, m, Span<const int32_t>(tokens.data() + b * bs, bs), page, &inserted);
    if (key == 0) break;  // the page holds another key (see prefix_cache.h)
    if (inserted) pool_.set_cached(page, true);
    st.block_keys.push_back(key);
  }
  return Status::Ok();
}

void BlockManager::reset_prefix_cache() {
  for (int32_t p = 0; p < num_pages(); ++p) unregister(p);
  for (auto& [id, seq] : seqs_)
    for (SeqModelState& st : seq.models) st.block_keys.clear();
  evictions_ = hit_pages_ = 0;
}

}  // namespace specd
