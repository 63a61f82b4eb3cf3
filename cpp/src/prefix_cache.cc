// PrefixCache: the rules of prefix_cache.h.
#include "specd/prefix_cache.h"

#include <algorithm>

#include "hash_util.h"

namespace specd {

PrefixCache::PrefixCache(int32_t num_pages) : entries_(static_cast<std::size_t>(std::max(0, num_pages))) {}

uint64_t PrefixCache::hash_of(uint64_t parent, int32_t model, Span<const int32_t> tokens) {
  uint64_t h = detail::mix64(parent ^ (static_cast<uint64_t>(static_cast<uint32_t>(model)) << 56));
  for (int32_t t : tokens) h = detail::mix64(h ^ static_cast<uint32_t>(t));
  return h;
}

bool PrefixCache::same(const Entry& e, uint64_t parent, int32_t model, Span<const int32_t> tokens) const {
  return e.parent == parent && e.model == model && e.tokens.size() == tokens.size() &&
         std::equal(tokens.begin(), tokens.end(), e.tokens.begin());
}

int32_t PrefixCache::lookup(uint64_t hash, uint64_t parent, int32_t model, Span<const int32_t> tokens) const {
  const auto [first, last] = index_.equal_range(hash);
  for (auto it = first; it != last; ++it)
    if (same(entries_[static_cast<std::size_t>(it->second)], parent, model, tokens)) return it->second;
  return -1;
}

uint64_t PrefixCache::find(uint64_t parent, int32_t model, Span<const int32_t> tokens, int32_t* page) const {
  *page = lookup(hash_of(parent, model, tokens), parent, model, tokens);
  return *page >= 0 ? entries_[static_cast<std::size_t>(*page)].id : 0;
}

uint64_t PrefixCache::insert(uint64_t parent, int32_t model, Span<const int32_t> tokens, int32_t page,
                             bool* inserted) {
  *inserted = false;
  const uint64_t hash = hash_of(parent, model, tokens);
  const int32_t existing = lookup(hash, parent, model, tokens);
  if (existing >= 0) return entries_[static_cast<std::size_t>(existing)].id;
  Entry& e = entries_[static_cast<std::size_t>(page)];
  if (e.id != 0) return 0;
  e.id = next_id_++;
  e.parent = parent;
  e.model = model;
  e.hash = hash;
  e.tokens.assign(tokens.begin(), tokens.end());
  index_.emplace(hash, page);
  *inserted = true;
  return e.id;
}

void PrefixCache::erase_page(int32_t page) {
  Entry& e = entries_[static_cast<std::size_t>(page)];
  if (e.id == 0) return;
  const auto [first, last] = index_.equal_range(e.hash);
  for (auto it = first; it != last; ++it)
    if (it->second == page) {
      index_.erase(it);
      break;
    }
  e = Entry{};
}

}  // namespace specd
