// BlockManager: read-only side — per-sequence queries, block-table exports for attention
// kernels, and the full invariant check used by tests.
#include <algorithm>
#include <unordered_map>

#include "specd/block_manager.h"

namespace specd {

Status BlockManager::info(SeqId seq, ModelIndex m, SeqKvInfo* out) const {
  SPECD_RETURN_IF_ERROR(check_model(m));
  const Sequence* s = nullptr;
  SPECD_RETURN_IF_ERROR(find(seq, &s));
  const SeqModelState& st = s->models[static_cast<std::size_t>(m)];
  *out = SeqKvInfo{st.committed, st.reserved, static_cast<int32_t>(st.pages.size())};
  return Status::Ok();
}

Status BlockManager::pages(SeqId seq, ModelIndex m, const std::vector<int32_t>** out) const {
  SPECD_RETURN_IF_ERROR(check_model(m));
  const Sequence* s = nullptr;
  SPECD_RETURN_IF_ERROR(find(seq, &s));
  *out = &s->models[static_cast<std::size_t>(m)].pages;
  return Status::Ok();
}

Status BlockManager::slots(SeqId seq, ModelIndex m, int64_t p0, int64_t p1,
                           std::vector<int64_t>* out) const {
  SPECD_RETURN_IF_ERROR(check_model(m));
  const Sequence* s = nullptr;
  SPECD_RETURN_IF_ERROR(find(seq, &s));
  const SeqModelState& st = s->models[static_cast<std::size_t>(m)];
  const int64_t extent = st.committed + st.reserved;
  if (p0 < 0 || p0 > p1 || p1 > extent)
    return error_status(StatusCode::kOutOfRange, "slots: range [", p0, ", ", p1,
                        ") is not inside [0, ", extent, ") of sequence ", seq, " for model '",
                        models_[m].spec.name, "'");
  const int64_t bs = block_size(m);
  out->clear();
  out->reserve(static_cast<std::size_t>(p1 - p0));
  for (int64_t p = p0; p < p1; ++p)
    out->push_back(int64_t{st.pages[static_cast<std::size_t>(p / bs)]} * bs + p % bs);
  return Status::Ok();
}

Status BlockManager::export_csr(ModelIndex m, Span<const SeqId> seqs, BlockTableCsr* out) const {
  SPECD_RETURN_IF_ERROR(check_model(m));
  const int64_t bs = block_size(m);
  out->indptr.assign(1, 0);
  out->indices.clear();
  out->last_page_len.clear();
  out->indptr.reserve(seqs.size() + 1);
  out->last_page_len.reserve(seqs.size());
  for (SeqId id : seqs) {
    const Sequence* s = nullptr;
    SPECD_RETURN_IF_ERROR(find(id, &s));
    const SeqModelState& st = s->models[static_cast<std::size_t>(m)];
    out->indices.insert(out->indices.end(), st.pages.begin(), st.pages.end());
    out->indptr.push_back(static_cast<int32_t>(out->indices.size()));
    const int64_t extent = st.committed + st.reserved;
    const int64_t full = static_cast<int64_t>(st.pages.size()) - 1;
    out->last_page_len.push_back(st.pages.empty() ? 0 : static_cast<int32_t>(extent - full * bs));
  }
  return Status::Ok();
}

Status BlockManager::export_padded(ModelIndex m, Span<const SeqId> seqs, int32_t width,
                                   int32_t pad, std::vector<int32_t>* out,
                                   int32_t* out_width) const {
  SPECD_RETURN_IF_ERROR(check_model(m));
  std::vector<const SeqModelState*> states(seqs.size());
  std::size_t widest = 0;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const Sequence* s = nullptr;
    SPECD_RETURN_IF_ERROR(find(seqs[i], &s));
    states[i] = &s->models[static_cast<std::size_t>(m)];
    widest = std::max(widest, states[i]->pages.size());
  }
  if (width <= 0) {
    width = static_cast<int32_t>(widest);
  } else if (widest > static_cast<std::size_t>(width)) {
    return error_status(StatusCode::kInvalidArgument, "export_padded: width ", width,
                        " is smaller than the ", widest, " pages of the longest sequence");
  }
  out->assign(seqs.size() * static_cast<std::size_t>(width), pad);
  for (std::size_t i = 0; i < states.size(); ++i)
    std::copy(states[i]->pages.begin(), states[i]->pages.end(),
              out->begin() + static_cast<std::ptrdiff_t>(i * static_cast<std::size_t>(width)));
  *out_width = width;
  return Status::Ok();
}

Status BlockManager::export_kv_lens(ModelIndex m, Span<const SeqId> seqs,
                                    std::vector<int32_t>* out) const {
  SPECD_RETURN_IF_ERROR(check_model(m));
  out->clear();
  out->reserve(seqs.size());
  for (SeqId id : seqs) {
    const Sequence* s = nullptr;
    SPECD_RETURN_IF_ERROR(find(id, &s));
    const SeqModelState& st = s->models[static_cast<std::size_t>(m)];
    out->push_back(static_cast<int32_t>(st.committed + st.reserved));
  }
  return Status::Ok();
}

Status BlockManager::check_invariants() const {
  SPECD_RETURN_IF_ERROR(pool_.check_invariants());
  std::vector<int32_t> refs(static_cast<std::size_t>(num_pages()), 0);
  std::vector<int32_t> owner(static_cast<std::size_t>(num_pages()), -1);
  for (const auto& [id, seq] : seqs_) {
    if (seq.models.size() != models_.size())
      return error_status(StatusCode::kInternal, "sequence ", id, " has state for ",
                          seq.models.size(), " models, expected ", models_.size());
    for (std::size_t m = 0; m < models_.size(); ++m) {
      const SeqModelState& st = seq.models[m];
      const int64_t bs = models_[m].block_size;
      if (st.committed < 0 || st.reserved < 0)
        return error_status(StatusCode::kInternal, "sequence ", id, " has negative length");
      const int64_t want = (st.committed + st.reserved + bs - 1) / bs;
      if (static_cast<int64_t>(st.pages.size()) != want)
        return error_status(StatusCode::kInternal, "sequence ", id, " model ", m, " holds ",
                            st.pages.size(), " pages for ", st.committed, "+", st.reserved,
                            " tokens; expected ", want);
      for (std::size_t b = 0; b < st.pages.size(); ++b) {
        const int32_t page = st.pages[b];
        if (page < 0 || page >= num_pages())
          return error_status(StatusCode::kInternal, "sequence ", id, " names invalid page ", page);
        const std::size_t p = static_cast<std::size_t>(page);
        if (owner[p] != -1 && owner[p] != static_cast<int32_t>(m))
          return error_status(StatusCode::kInternal, "page ", page, " serves models ", owner[p],
                              " and ", m);
        owner[p] = static_cast<int32_t>(m);
        ++refs[p];
      }
      // Pages that hold reserved (writable) slots must belong to this sequence alone and
      // hold no registered block.
      if (st.reserved > 0) {
        for (std::size_t b = static_cast<std::size_t>(st.committed / bs); b < st.pages.size(); ++b) {
          if (pool_.refcount(st.pages[b]) != 1)
            return error_status(StatusCode::kInternal, "sequence ", id, " writes into page ",
                                st.pages[b], " shared by ", pool_.refcount(st.pages[b]),
                                " sequences");
          if (pool_.cached(st.pages[b]))
            return error_status(StatusCode::kInternal, "sequence ", id, " writes into page ",
                                st.pages[b], ", which holds a registered prefix block");
        }
      }
      // Its registered chain covers full committed blocks only. (A page in it may hold
      // another key for an equal block: a private copy registered by a fork sharing it after
      // the original was evicted.)
      if (static_cast<int64_t>(st.block_keys.size()) > st.committed / bs)
        return error_status(StatusCode::kInternal, "sequence ", id, " model ", m, " has ",
                            st.block_keys.size(), " registered blocks but ", st.committed,
                            " committed tokens");
    }
  }
  for (int32_t p = 0; p < num_pages(); ++p) {
    const bool registered = prefix_caching_ && cache_.has_page(p);
    if (registered != pool_.cached(p))
      return error_status(StatusCode::kInternal, "page ", p,
                          registered ? " holds a prefix-cache key but the pool does not mark it cached"
                                     : " is marked cached but holds no prefix-cache key");
  }
  for (int32_t p = 0; p < num_pages(); ++p)
    if (refs[static_cast<std::size_t>(p)] != pool_.refcount(p))
      return error_status(StatusCode::kInternal, "page ", p, " has refcount ", pool_.refcount(p),
                          " but ", refs[static_cast<std::size_t>(p)], " block-table references");
  return Status::Ok();
}

}  // namespace specd
