// BlockManager: creation, sequence lifecycle, reserve / commit / rollback (single and batched).
// Exports, queries and the invariant check live in block_table_export.cc.
#include "specd/block_manager.h"

#include <algorithm>
#include <limits>
#include <unordered_set>
#include <utility>

namespace specd {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Status BlockManager::create(const BlockManagerConfig& config, std::unique_ptr<BlockManager>* out) {
  if (config.page_bytes <= 0)
    return error_status(StatusCode::kInvalidArgument, "page_bytes must be > 0, got ",
                        config.page_bytes);
  if (config.num_pages <= 0)
    return error_status(StatusCode::kInvalidArgument, "num_pages must be > 0, got ",
                        config.num_pages);
  if (config.block_align <= 0)
    return error_status(StatusCode::kInvalidArgument, "block_align must be > 0, got ",
                        config.block_align);
  if (config.models.empty() || config.models.size() > static_cast<std::size_t>(kMaxModels))
    return error_status(StatusCode::kInvalidArgument, "models must list 1..", kMaxModels,
                        " models, got ", config.models.size());
  std::vector<ModelState> models;
  std::unordered_set<std::string> names;
  for (const ModelKvSpec& spec : config.models) {
    if (spec.name.empty())
      return error_status(StatusCode::kInvalidArgument, "model names must be non-empty");
    if (!names.insert(spec.name).second)
      return error_status(StatusCode::kInvalidArgument, "model name '", spec.name,
                          "' appears twice");
    if (spec.kv_bytes_per_token <= 0)
      return error_status(StatusCode::kInvalidArgument, "model '", spec.name,
                          "': kv_bytes_per_token must be > 0, got ", spec.kv_bytes_per_token);
    const int64_t fit = config.page_bytes / spec.kv_bytes_per_token;
    const int64_t block = fit / config.block_align * config.block_align;
    if (block < 1)
      return error_status(StatusCode::kInvalidArgument, "model '", spec.name, "': a page of ",
                          config.page_bytes, " bytes holds no block of ", config.block_align,
                          " token(s) at ", spec.kv_bytes_per_token, " bytes per token");
    if (block > std::numeric_limits<int32_t>::max())
      return error_status(StatusCode::kInvalidArgument, "model '", spec.name, "': ", block,
                          " tokens per block is more than a block can address");
    models.push_back(ModelState{spec, static_cast<int32_t>(block)});
  }
  out->reset(new BlockManager(std::move(models), config.page_bytes, config.num_pages,
                              config.prefix_caching));
  return Status::Ok();
}

BlockManager::BlockManager(std::vector<ModelState> models, int64_t page_bytes, int32_t num_pages,
                           bool prefix_caching)
    : models_(std::move(models)),
      page_bytes_(page_bytes),
      pool_(num_pages),
      prefix_caching_(prefix_caching),
      cache_(prefix_caching ? num_pages : 0) {}

ModelIndex BlockManager::model_index(const std::string& name) const {
  for (std::size_t m = 0; m < models_.size(); ++m)
    if (models_[m].spec.name == name) return static_cast<ModelIndex>(m);
  return -1;
}

int64_t BlockManager::pages_for_tokens(ModelIndex m, int64_t num_tokens) const {
  if (m < 0 || m >= num_models() || num_tokens <= 0) return 0;
  return ceil_div(num_tokens, block_size(m));
}

bool BlockManager::can_admit(Span<const int64_t> tokens_per_model, int64_t headroom_pages) const {
  if (tokens_per_model.size() > models_.size()) return false;
  int64_t need = headroom_pages;
  for (std::size_t m = 0; m < tokens_per_model.size(); ++m)
    need += pages_for_tokens(static_cast<ModelIndex>(m), tokens_per_model[m]);
  return need <= num_free_pages();
}

Status BlockManager::check_model(ModelIndex m) const {
  if (m < 0 || m >= num_models())
    return error_status(StatusCode::kInvalidArgument, "model index ", m, " out of range [0, ",
                        num_models(), ")");
  return Status::Ok();
}

Status BlockManager::find(SeqId seq, Sequence** out) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return error_status(StatusCode::kNotFound, "unknown sequence ", seq);
  *out = &it->second;
  return Status::Ok();
}

Status BlockManager::find(SeqId seq, const Sequence** out) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return error_status(StatusCode::kNotFound, "unknown sequence ", seq);
  *out = &it->second;
  return Status::Ok();
}

Status BlockManager::out_of_pages(const char* what, int64_t needed) const {
  return error_status(StatusCode::kOutOfPages, what, " needs ", needed, " page(s), ",
                      num_free_pages(), " of ", num_pages(), " free");
}

// ---- sequence lifecycle ----

Status BlockManager::add_sequence(SeqId seq) {
  if (contains(seq))
    return error_status(StatusCode::kAlreadyExists, "sequence ", seq, " already exists");
  Sequence s;
  s.models.resize(models_.size());
  seqs_.emplace(seq, std::move(s));
  return Status::Ok();
}

Status BlockManager::free_sequence(SeqId seq) {
  Sequence* s = nullptr;
  SPECD_RETURN_IF_ERROR(find(seq, &s));
  // Last block first: of a sequence's registered pages, the LRU list evicts its last ones
  // first (a prefix is only useful while its first blocks stay).
  for (SeqModelState& st : s->models)
    for (auto it = st.pages.rbegin(); it != st.pages.rend(); ++it) pool_.release(*it);
  seqs_.erase(seq);
  return Status::Ok();
}

Status BlockManager::fork(SeqId parent, SeqId child) {
  Sequence* p = nullptr;
  SPECD_RETURN_IF_ERROR(find(parent, &p));
  if (contains(child))
    return error_status(StatusCode::kAlreadyExists, "fork: child sequence ", child,
                        " already exists");
  for (std::size_t m = 0; m < models_.size(); ++m)
    if (p->models[m].reserved != 0)
      return error_status(StatusCode::kFailedPrecondition, "fork: parent sequence ", parent,
                          " has ", p->models[m].reserved, " reserved slot(s) for model '",
                          models_[m].spec.name, "'; commit or roll back first");
  Sequence c;
  c.models = p->models;  // same pages and lengths; reserved == 0 everywhere
  for (const SeqModelState& st : c.models)
    for (int32_t page : st.pages) pool_.retain(page);
  seqs_.emplace(child, std::move(c));  // may rehash; `p` is not used after this
  return Status::Ok();
}

// ---- reserve ----

Status BlockManager::plan_reserve(SeqId id, Sequence* seq, ModelIndex m, int32_t n,
                                  ReservePlan* plan) const {
  if (n < 0)
    return error_status(StatusCode::kInvalidArgument, "reserve: n must be >= 0, got ", n,
                        " (sequence ", id, ")");
  const SeqModelState& st = seq->models[static_cast<std::size_t>(m)];
  if (st.reserved != 0)
    return error_status(StatusCode::kFailedPrecondition, "reserve: sequence ", id, " already has ",
                        st.reserved, " reserved slot(s) for model '", models_[m].spec.name,
                        "'; commit or roll back first");
  const int64_t bs = block_size(m);
  const int64_t have = static_cast<int64_t>(st.pages.size());
  const int64_t new_pages = std::max<int64_t>(0, ceil_div(st.committed + n, bs) - have);
  // The page holding position c is written into when c is inside it (not at a boundary).
  const bool cow = n > 0 && st.committed % bs != 0 && pool_.refcount(st.pages.back()) > 1;
  plan->seq = seq;
  plan->n = n;
  plan->pages_needed = new_pages + (cow ? 1 : 0);
  plan->cow_page = cow ? st.pages.back() : -1;
  return Status::Ok();
}

void BlockManager::apply_reserve(const ReservePlan& plan, ModelIndex m, Reservation* out) {
  SeqModelState& st = plan.seq->models[static_cast<std::size_t>(m)];
  const int64_t bs = block_size(m);
  if (plan.n > 0 && st.committed % bs != 0) {  // writes into the page holding position c
    if (pool_.refcount(st.pages.back()) > 1) {
      const int32_t copy = take_page();  // counted by plan_reserve
      out->copies.push_back(PageCopy{m, st.pages.back(), copy, static_cast<int32_t>(st.committed % bs)});
      pool_.release(st.pages.back());
      st.pages.back() = copy;
    } else {
      unregister(st.pages.back());
    }
  }
  const int64_t end = st.committed + plan.n;
  while (static_cast<int64_t>(st.pages.size()) * bs < end) st.pages.push_back(take_page());  // counted
  st.reserved = plan.n;
  // Slots of [c, end): walk page by page instead of dividing per position.
  int64_t pos = st.committed;
  while (pos < end) {
    const int64_t page = st.pages[static_cast<std::size_t>(pos / bs)];
    const int64_t page_end = std::min(end, (pos / bs + 1) * bs);
    const int64_t base = page * bs - (pos / bs) * bs;
    for (; pos < page_end; ++pos) out->slots.push_back(base + pos);
  }
}

Status BlockManager::reserve(SeqId seq, ModelIndex m, int32_t n, Reservation* out) {
  SPECD_RETURN_IF_ERROR(check_model(m));
  Sequence* s = nullptr;
  SPECD_RETURN_IF_ERROR(find(seq, &s));
  ReservePlan plan{};
  SPECD_RETURN_IF_ERROR(plan_reserve(seq, s, m, n, &plan));
  if (plan.pages_needed > num_free_pages()) return out_of_pages("reserve", plan.pages_needed);
  out->slots.clear();
  out->copies.clear();
  apply_reserve(plan, m, out);
  return Status::Ok();
}

// Each plan that writes into a shared page counted one copy. When s plans of the batch write
// into the same page of refcount r, only min(s, r - 1) copies happen: applying them in order,
// each copy drops the page's refcount, and a writer that finds it at 1 keeps the page.
int64_t BlockManager::copies_spared_in_batch() {
  if (cow_pages_.size() < 2) return 0;
  std::sort(cow_pages_.begin(), cow_pages_.end());
  int64_t spared = 0;
  for (std::size_t i = 0; i < cow_pages_.size();) {
    std::size_t j = i;
    while (j < cow_pages_.size() && cow_pages_[j] == cow_pages_[i]) ++j;
    const int64_t writers = static_cast<int64_t>(j - i);
    spared += std::max<int64_t>(0, writers - (pool_.refcount(cow_pages_[i]) - 1));
    i = j;
  }
  return spared;
}

Status BlockManager::reserve_batch(ModelIndex m, Span<const SeqId> seqs, Span<const int32_t> n,
                                   Reservation* out) {
  SPECD_RETURN_IF_ERROR(check_model(m));
  if (seqs.size() != n.size())
    return error_status(StatusCode::kInvalidArgument, "reserve_batch: ", seqs.size(),
                        " sequences but ", n.size(), " counts");
  const uint64_t mark = ++batch_epoch_;
  std::vector<ReservePlan>& plans = plans_;
  plans.resize(seqs.size());
  cow_pages_.clear();
  int64_t needed = 0;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    Sequence* s = nullptr;
    SPECD_RETURN_IF_ERROR(find(seqs[i], &s));
    if (s->batch_mark == mark)
      return error_status(StatusCode::kInvalidArgument, "reserve_batch: sequence ", seqs[i],
                          " appears more than once");
    s->batch_mark = mark;
    SPECD_RETURN_IF_ERROR(plan_reserve(seqs[i], s, m, n[i], &plans[i]));
    needed += plans[i].pages_needed;
    if (plans[i].cow_page >= 0) cow_pages_.push_back(plans[i].cow_page);
  }
  needed -= copies_spared_in_batch();
  if (needed > num_free_pages()) return out_of_pages("reserve_batch", needed);
  out->slots.clear();
  out->copies.clear();
  for (const ReservePlan& plan : plans) apply_reserve(plan, m, out);
  return Status::Ok();
}

// ---- commit / rollback ----

void BlockManager::truncate(SeqModelState* st, ModelIndex m, int64_t len) {
  st->committed = len;
  st->reserved = 0;
  st->block_keys.resize(std::min(st->block_keys.size(), static_cast<std::size_t>(len / block_size(m))));
  const std::size_t keep = static_cast<std::size_t>(ceil_div(len, block_size(m)));
  while (st->pages.size() > keep) {
    pool_.release(st->pages.back());
    st->pages.pop_back();
  }
}

Status BlockManager::check_commit(SeqId id, const Sequence& seq, ModelIndex m,
                                  int32_t num_accepted) const {
  const SeqModelState& st = seq.models[static_cast<std::size_t>(m)];
  if (num_accepted < 0)
    return error_status(StatusCode::kInvalidArgument, "commit: num_accepted must be >= 0, got ",
                        num_accepted, " (sequence ", id, ")");
  if (num_accepted > st.reserved)
    return error_status(StatusCode::kFailedPrecondition, "commit: sequence ", id, " accepts ",
                        num_accepted, " but only ", st.reserved,
                        " slot(s) are reserved for model '", models_[m].spec.name, "'");
  return Status::Ok();
}

Status BlockManager::commit(SeqId seq, ModelIndex m, int32_t num_accepted) {
  SPECD_RETURN_IF_ERROR(check_model(m));
  Sequence* s = nullptr;
  SPECD_RETURN_IF_ERROR(find(seq, &s));
  SPECD_RETURN_IF_ERROR(check_commit(seq, *s, m, num_accepted));
  SeqModelState& st = s->models[static_cast<std::size_t>(m)];
  truncate(&st, m, st.committed + num_accepted);
  return Status::Ok();
}

Status BlockManager::commit_batch(ModelIndex m, Span<const SeqId> seqs,
                                  Span<const int32_t> num_accepted) {
  SPECD_RETURN_IF_ERROR(check_model(m));
  if (seqs.size() != num_accepted.size())
    return error_status(StatusCode::kInvalidArgument, "commit_batch: ", seqs.size(),
                        " sequences but ", num_accepted.size(), " counts");
  const uint64_t mark = ++batch_epoch_;
  std::vector<Sequence*>& found = batch_seqs_;
  found.resize(seqs.size());
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    SPECD_RETURN_IF_ERROR(find(seqs[i], &found[i]));
    if (found[i]->batch_mark == mark)
      return error_status(StatusCode::kInvalidArgument, "commit_batch: sequence ", seqs[i],
                          " appears more than once");
    found[i]->batch_mark = mark;
    SPECD_RETURN_IF_ERROR(check_commit(seqs[i], *found[i], m, num_accepted[i]));
  }
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    SeqModelState& st = found[i]->models[static_cast<std::size_t>(m)];
    truncate(&st, m, st.committed + num_accepted[i]);
  }
  return Status::Ok();
}

Status BlockManager::rollback(SeqId seq, ModelIndex m, int64_t new_len) {
  SPECD_RETURN_IF_ERROR(check_model(m));
  Sequence* s = nullptr;
  SPECD_RETURN_IF_ERROR(find(seq, &s));
  SeqModelState& st = s->models[static_cast<std::size_t>(m)];
  if (new_len < 0)
    return error_status(StatusCode::kInvalidArgument, "rollback: new_len must be >= 0, got ",
                        new_len, " (sequence ", seq, ")");
  if (new_len > st.committed)
    return error_status(StatusCode::kOutOfRange, "rollback: new_len ", new_len,
                        " is past the committed length ", st.committed, " of sequence ", seq,
                        " for model '", models_[m].spec.name, "'");
  truncate(&st, m, new_len);
  return Status::Ok();
}

}  // namespace specd
