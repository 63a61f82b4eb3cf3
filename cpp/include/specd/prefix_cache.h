// PrefixCache: which page holds the KV of which full block of tokens, for automatic prefix
// caching (the hashed block cache of vLLM, the radix cache of SGLang): a request whose
// prompt starts with blocks another request computed adopts their pages instead of
// recomputing them.
//
// Words
// - block key: one full block of one model's tokens together with everything before it,
//   named by (parent, model, tokens): `parent` is the key id of the block before it (0 for
//   a sequence's first block). So a key names a whole prefix, and KV (which depends on every
//   earlier token and on the positions) is shared only between equal prefixes.
// - key id: a number > 0 given to each registered block, never reused: a block registered
//   under a parent that was later evicted can never be reached by a lookup again.
//
// Rules
// - Lookups compare the tokens, not only their hash: two different prefixes never alias.
// - A page holds at most one block key, and a key is registered on at most one page.
// - insert() of a key already registered returns the existing id and registers nothing
//   (the caller's page holds an equal copy and stays private); insert() into a page that
//   already holds another key registers nothing and returns 0.
// - erase_page() forgets the page's key (eviction, or a write into the page).
// - Cost: find and insert hash and compare one block, O(block_size); erase_page is O(1) on
//   average. Not thread-safe: the BlockManager that owns it is single-threaded.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "specd/span.h"

namespace specd {

class PrefixCache {
 public:
  explicit PrefixCache(int32_t num_pages);

  // The key id of block `tokens` of model `model` after key `parent`, and its page in *page;
  // 0 (and *page = -1) when it is not registered.
  uint64_t find(uint64_t parent, int32_t model, Span<const int32_t> tokens, int32_t* page) const;
  // Registers `page` as holding the block (see the rules); returns the key id (0: not
  // registered because the page holds another key). *inserted: whether `page` was registered.
  uint64_t insert(uint64_t parent, int32_t model, Span<const int32_t> tokens, int32_t page,
                  bool* inserted);
  void erase_page(int32_t page);
  bool has_page(int32_t page) const { return entries_[static_cast<std::size_t>(page)].id != 0; }
  // The key id registered on `page` (0: none).
  uint64_t key_of_page(int32_t page) const { return entries_[static_cast<std::size_t>(page)].id; }
  int64_t size() const { return static_cast<int64_t>(index_.size()); }

 private:
  struct Entry {
    uint64_t id = 0;  // 0: the page holds no key
    uint64_t parent = 0;
    int32_t model = 0;
    uint64_t hash = 0;
    std::vector<int32_t> tokens;
  };
  static uint64_t hash_of(uint64_t parent, int32_t model, Span<const int32_t> tokens);
  bool same(const Entry& e, uint64_t parent, int32_t model, Span<const int32_t> tokens) const;
  int32_t lookup(uint64_t hash, uint64_t parent, int32_t model, Span<const int32_t> tokens) const;

  std::vector<Entry> entries_;                         // [num_pages]
  std::unordered_multimap<uint64_t, int32_t> index_;  // hash -> page
  uint64_t next_id_ = 1;
};

}  // namespace specd
