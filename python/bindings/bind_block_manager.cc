// Python binding of specd::BlockManager (exports only; the rules are in block_manager.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "errors.h"
#include "numpy_util.h"
#include "specd/block_manager.h"
#include "specd/step_planner.h"

namespace py = pybind11;

namespace specd::py_bind {
namespace {

using ModelArg = std::variant<int32_t, std::string>;

// A reservation as Python sees it: numpy arrays that own their memory.
struct PyReservation {
  py::array_t<int64_t> slots;   // [n] int64
  py::array_t<int32_t> copies;  // [num_copies, 4] int32 rows (model, src_page, dst_page, num_tokens)
};

PyReservation to_python(Reservation&& r) {
  std::vector<int32_t> flat;
  flat.reserve(r.copies.size() * 4);
  for (const PageCopy& c : r.copies) flat.insert(flat.end(), {c.model, c.src_page, c.dst_page, c.num_tokens});
  const auto rows = static_cast<py::ssize_t>(r.copies.size());
  return PyReservation{to_numpy(std::move(r.slots)), to_numpy(std::move(flat), {rows, 4})};
}

class PyBlockManager {
 public:
  PyBlockManager(int64_t page_bytes, int32_t num_pages,
                 const std::vector<std::pair<std::string, int64_t>>& models, int32_t block_align,
                 bool prefix_caching) {
    BlockManagerConfig config;
    config.prefix_caching = prefix_caching;
    config.page_bytes = page_bytes;
    config.num_pages = num_pages;
    config.block_align = block_align;
    for (const auto& [name, bytes] : models) config.models.push_back(ModelKvSpec{name, bytes});
    check(BlockManager::create(config, &bm_));
  }

  BlockManager& get() { return *bm_; }
  const BlockManager& get() const { return *bm_; }

  ModelIndex model(const ModelArg& arg) const {
    if (const auto* index = std::get_if<int32_t>(&arg)) {
      if (*index < 0 || *index >= bm_->num_models())
        raise_status(error_status(StatusCode::kInvalidArgument, "model index ", *index,
                                  " out of range [0, ", bm_->num_models(), ")"));
      return *index;
    }
    const std::string& name = std::get<std::string>(arg);
    const ModelIndex m = bm_->model_index(name);
    if (m < 0) raise_status(error_status(StatusCode::kInvalidArgument, "unknown model '", name,
                                         "' (models: ", model_names_text(), ")"));
    return m;
  }

  std::vector<std::string> model_names() const {
    std::vector<std::string> names;
    for (ModelIndex m = 0; m < bm_->num_models(); ++m) names.push_back(bm_->model(m).name);
    return names;
  }

 private:
  std::string model_names_text() const {
    std::string text;
    for (const std::string& n : model_names()) text += (text.empty() ? "" : ", ") + n;
    return text;
  }

  std::unique_ptr<BlockManager> bm_;
};

// A StepPlanner query of one request with two int64 outputs (cached_prefix, candidate_work),
// as a Python tuple; its error status raised.
template <class Query>
py::tuple planner_pair(const StepPlanner& p, int64_t id, Query query) {
  int64_t first = 0, second = 0;
  check((p.*query)(id, &first, &second));
  return py::make_tuple(first, second);
}

}  // namespace

void bind_block_manager(py::module_& m) {
  py::class_<SeqKvInfo>(m, "SeqKvInfo", "Lengths of one sequence for one model.")
      .def_readonly("committed", &SeqKvInfo::committed, "committed length c")
      .def_readonly("reserved", &SeqKvInfo::reserved, "reserved lookahead slots r")
      .def_readonly("num_pages", &SeqKvInfo::num_pages, "pages held: ceil((c + r) / block_size)")
      .def("__repr__", [](const SeqKvInfo& i) {
        return "SeqKvInfo(committed=" + std::to_string(i.committed) + ", reserved=" +
               std::to_string(i.reserved) + ", num_pages=" + std::to_string(i.num_pages) + ")";
      });

  py::class_<PyReservation>(m, "Reservation", "Slots reserved by reserve / reserve_batch.")
      .def_readonly("slots", &PyReservation::slots, "int64 [n]: slot of each reserved position")
      .def_readonly("copies", &PyReservation::copies,
                    "int32 [num_copies, 4]: copy-on-write copies (model, src_page, dst_page, "
                    "num_tokens) to perform before writing the slots")
      .def("__repr__", [](const PyReservation& r) {
        return "Reservation(" + std::to_string(r.slots.size()) + " slots, " +
               std::to_string(r.copies.shape(0)) + " copies)";
      });

  using BM = PyBlockManager;
  const auto model0 = py::arg("model") = ModelArg(int32_t{0});
  py::class_<BM>(m, "BlockManager",
                 "Paged KV-cache allocator with lookahead reservation, commit/rollback and fork "
                 "with copy-on-write, for one or more models sharing one page pool. See "
                 "docs/api.md for the rules.")
      .def(py::init<int64_t, int32_t, const std::vector<std::pair<std::string, int64_t>>&, int32_t, bool>(),
           py::arg("page_bytes"), py::arg("num_pages"), py::arg("models"),
           py::arg("block_align") = 1, py::arg("prefix_caching") = false,
           "models: list of (name, kv_bytes_per_token); the first is the target by convention. "
           "prefix_caching: register full committed blocks so later sequences adopt them.")
      .def_property_readonly("prefix_caching", [](const BM& b) { return b.get().prefix_caching(); })
      .def_property_readonly("prefix_cache_stats",
                             [](const BM& b) {
                               const PrefixCacheStats s = b.get().prefix_cache_stats();
                               py::dict d;
                               d["cached_pages"] = s.cached_pages;
                               d["evictable_pages"] = s.evictable_pages;
                               d["evictions"] = s.evictions;
                               d["hit_pages"] = s.hit_pages;
                               return d;
                             },
                             "dict: cached_pages (registered), evictable_pages (registered, unreferenced), "
                             "evictions and hit_pages (adopted by match_prefix) since creation or the last "
                             "reset_prefix_cache().")
      .def("match_prefix",
           [](BM& b, SeqId s, const InArray<int32_t>& tokens, int64_t max_tokens, const ModelArg& mi) {
             int64_t matched = 0;
             check(b.get().match_prefix(s, b.model(mi), as_span(tokens, "tokens"), max_tokens, &matched));
             return matched;
           },
           py::arg("seq"), py::arg("tokens"), py::arg("max_tokens"), model0,
           "For a sequence with no KV for the model: adopts the pages of the longest registered prefix of "
           "`tokens` (whole blocks, at most max_tokens tokens); returns its length (its committed length now).")
      .def("cached_prefix",
           [](BM& b, const InArray<int32_t>& tokens, int64_t max_tokens, const ModelArg& mi) {
             return b.get().cached_prefix(b.model(mi), as_span(tokens, "tokens"), max_tokens);
           },
           py::arg("tokens"), py::arg("max_tokens"), model0,
           "The tokens match_prefix would adopt for `tokens` now (whole blocks, at most max_tokens), adopting "
           "nothing.")
      .def("cache_blocks",
           [](BM& b, SeqId s, const InArray<int32_t>& tokens, const ModelArg& mi) {
             check(b.get().cache_blocks(s, b.model(mi), as_span(tokens, "tokens")));
           },
           py::arg("seq"), py::arg("tokens"), model0,
           "Registers the sequence's full committed blocks not registered yet; `tokens` are its tokens from 0.")
      .def("reset_prefix_cache", [](BM& b) { b.get().reset_prefix_cache(); },
           "Forgets every registered block (evictable pages become free) and zeroes the counts.")
      .def_property_readonly("num_models", [](const BM& b) { return b.get().num_models(); })
      .def_property_readonly("model_names", &BM::model_names)
      .def_property_readonly("page_bytes", [](const BM& b) { return b.get().page_bytes(); })
      .def_property_readonly("num_pages", [](const BM& b) { return b.get().num_pages(); })
      .def_property_readonly("num_free_pages", [](const BM& b) { return b.get().num_free_pages(); })
      .def_property_readonly("num_used_pages", [](const BM& b) { return b.get().num_used_pages(); })
      .def_property_readonly("num_sequences", [](const BM& b) { return b.get().num_sequences(); })
      .def("block_size", [](const BM& b, const ModelArg& mi) { return b.get().block_size(b.model(mi)); },
           model0, "Tokens per block (page) for the model.")
      .def("kv_bytes_per_token",
           [](const BM& b, const ModelArg& mi) { return b.get().model(b.model(mi)).kv_bytes_per_token; },
           model0)
      .def("page_refcount",
           [](const BM& b, int32_t page) {
             if (page < 0 || page >= b.get().num_pages())
               raise_status(error_status(StatusCode::kInvalidArgument, "page ", page,
                                         " out of range [0, ", b.get().num_pages(), ")"));
             return b.get().page_refcount(page);
           },
           py::arg("page"))
      .def("pages_for_tokens",
           [](const BM& b, int64_t n, const ModelArg& mi) { return b.get().pages_for_tokens(b.model(mi), n); },
           py::arg("num_tokens"), model0)
      .def("can_admit",
           [](const BM& b, const std::vector<int64_t>& tokens, int64_t headroom) {
             if (tokens.size() > static_cast<std::size_t>(b.get().num_models()))
               raise_status(error_status(StatusCode::kInvalidArgument, "can_admit: ", tokens.size(),
                                         " token counts for ", b.get().num_models(), " models"));
             return b.get().can_admit(Span<const int64_t>(tokens), headroom);
           },
           py::arg("tokens_per_model"), py::arg("headroom_pages") = 0,
           "Can a new sequence holding tokens_per_model[m] tokens of each model get its pages now?")
      .def("add_sequence", [](BM& b, SeqId s) { check(b.get().add_sequence(s)); }, py::arg("seq"))
      .def("free_sequence", [](BM& b, SeqId s) { check(b.get().free_sequence(s)); }, py::arg("seq"))
      .def("fork", [](BM& b, SeqId p, SeqId c) { check(b.get().fork(p, c)); },
           py::arg("parent"), py::arg("child"))
      .def("__contains__", [](const BM& b, SeqId s) { return b.get().contains(s); })
      .def("info",
           [](const BM& b, SeqId s, const ModelArg& mi) {
             SeqKvInfo out;
             check(b.get().info(s, b.model(mi), &out));
             return out;
           },
           py::arg("seq"), model0)
      .def("pages",
           [](const BM& b, SeqId s, const ModelArg& mi) {
             const std::vector<int32_t>* pages = nullptr;
             check(b.get().pages(s, b.model(mi), &pages));
             return to_numpy(std::vector<int32_t>(*pages));  // a snapshot: the table changes
           },
           py::arg("seq"), model0, "int32 [num_pages]: the sequence's block table (a copy).")
      .def("slots",
           [](const BM& b, SeqId s, int64_t p0, int64_t p1, const ModelArg& mi) {
             std::vector<int64_t> out;
             check(b.get().slots(s, b.model(mi), p0, p1, &out));
             return to_numpy(std::move(out));
           },
           py::arg("seq"), py::arg("start"), py::arg("stop"), model0,
           "int64 [stop - start]: slots of positions [start, stop).")
      .def("reserve",
           [](BM& b, SeqId s, int32_t n, const ModelArg& mi) {
             Reservation r;
             check(b.get().reserve(s, b.model(mi), n, &r));
             return to_python(std::move(r));
           },
           py::arg("seq"), py::arg("n"), model0)
      .def("commit", [](BM& b, SeqId s, int32_t a, const ModelArg& mi) { check(b.get().commit(s, b.model(mi), a)); },
           py::arg("seq"), py::arg("num_accepted"), model0)
      .def("rollback",
           [](BM& b, SeqId s, int64_t len, const ModelArg& mi) { check(b.get().rollback(s, b.model(mi), len)); },
           py::arg("seq"), py::arg("new_len"), model0)
      .def("reserve_batch",
           [](BM& b, const InArray<int64_t>& seqs, const InArray<int32_t>& n, const ModelArg& mi) {
             Reservation r;
             check(b.get().reserve_batch(b.model(mi), as_span(seqs, "seqs"), as_span(n, "n"), &r));
             return to_python(std::move(r));
           },
           py::arg("seqs"), py::arg("n"), model0)
      .def("commit_batch",
           [](BM& b, const InArray<int64_t>& seqs, const InArray<int32_t>& a, const ModelArg& mi) {
             check(b.get().commit_batch(b.model(mi), as_span(seqs, "seqs"), as_span(a, "num_accepted")));
           },
           py::arg("seqs"), py::arg("num_accepted"), model0)
      .def("block_table_csr",
           [](const BM& b, const InArray<int64_t>& seqs, const ModelArg& mi) {
             BlockTableCsr csr;
             check(b.get().export_csr(b.model(mi), as_span(seqs, "seqs"), &csr));
             return py::make_tuple(to_numpy(std::move(csr.indptr)), to_numpy(std::move(csr.indices)),
                                   to_numpy(std::move(csr.last_page_len)));
           },
           py::arg("seqs"), model0,
           "(indptr int32 [n+1], indices int32 [nnz], last_page_len int32 [n]), zero-copy.")
      .def("block_table_padded",
           [](const BM& b, const InArray<int64_t>& seqs, const ModelArg& mi, int32_t width, int32_t pad) {
             std::vector<int32_t> table;
             int32_t out_width = 0;
             Span<const SeqId> ids = as_span(seqs, "seqs");
             check(b.get().export_padded(b.model(mi), ids, width, pad, &table, &out_width));
             return to_numpy(std::move(table), {static_cast<py::ssize_t>(ids.size()), out_width});
           },
           py::arg("seqs"), model0, py::arg("width") = 0, py::arg("pad") = 0,
           "int32 [n, width] block table, zero-copy; width 0 means the widest sequence.")
      .def("block_table_into",
           [](const BM& b, const InArray<int64_t>& seqs, py::array_t<int64_t, py::array::c_style> out,
              const ModelArg& mi, int32_t pad) {
             if (out.ndim() != 2)
               raise_status(error_status(StatusCode::kInvalidArgument, "block_table_into: out must be 2-D, got ",
                                         out.ndim(), " dimensions"));
             Span<const SeqId> ids = as_span(seqs, "seqs");
             const auto rows = static_cast<std::size_t>(out.shape(0));
             const auto width = static_cast<int32_t>(out.shape(1));
             if (ids.size() > rows)
               raise_status(error_status(StatusCode::kInvalidArgument, "block_table_into: ", ids.size(),
                                         " sequences but out has ", rows, " rows"));
             std::vector<int32_t> table;
             int32_t out_width = 0;
             if (!ids.empty()) check(b.get().export_padded(b.model(mi), ids, width, pad, &table, &out_width));
             int64_t* dst = out.mutable_data();
             std::copy(table.begin(), table.end(), dst);
             std::fill(dst + table.size(), dst + rows * static_cast<std::size_t>(width), int64_t{pad});
           },
           py::arg("seqs"), py::arg("out").noconvert(), model0, py::arg("pad") = 0,
           "Writes the int64 [rows, width] array `out`: row i < len(seqs) is seqs[i]'s block table padded "
           "with `pad` (as block_table_padded with out's width), the rows past them all `pad`.")
      .def("kv_lens",
           [](const BM& b, const InArray<int64_t>& seqs, const ModelArg& mi) {
             std::vector<int32_t> out;
             check(b.get().export_kv_lens(b.model(mi), as_span(seqs, "seqs"), &out));
             return to_numpy(std::move(out));
           },
           py::arg("seqs"), model0, "int32 [n]: committed + reserved length of each sequence.")
      .def("check_invariants", [](const BM& b) { check(b.get().check_invariants()); },
           "Raises InternalError if any internal invariant is broken (O(pages + sequences)).");

  // The step planner works on a BlockManager of this module (step_planner.h has the rules).
  py::class_<StepPlanner>(m, "StepPlanner",
                          "The scheduler's per-step decisions over a BlockManager (step_planner.h).")
      .def(py::init([](BM& blocks, int32_t max_num_seqs, int32_t max_num_batched_tokens, bool uses_draft_kv,
                       int32_t k_max, int32_t model_free_tree_nodes, int32_t draft_tree_width,
                       int32_t draft_tree_nodes) {
             return std::make_unique<StepPlanner>(
                 &blocks.get(), StepPlannerConfig{max_num_seqs, max_num_batched_tokens, uses_draft_kv, k_max,
                                                  model_free_tree_nodes, draft_tree_width, draft_tree_nodes});
           }),
           py::arg("blocks"), py::arg("max_num_seqs"), py::arg("max_num_batched_tokens"), py::arg("uses_draft_kv"),
           py::arg("k_max"), py::arg("model_free_tree_nodes") = -1, py::arg("draft_tree_width") = 1,
           py::arg("draft_tree_nodes") = -1, py::keep_alive<1, 2>())
      .def("add", [](StepPlanner& p, int64_t id, bool use_prefix_cache) { check(p.add(id, use_prefix_cache)); },
           py::arg("request"), py::arg("use_prefix_cache") = true)
      .def("finish",
           [](StepPlanner& p, int64_t id, const std::vector<int32_t>& new_tokens) { check(p.finish(id, new_tokens)); },
           py::arg("request"), py::arg("new_tokens") = std::vector<int32_t>{},
           "With prefix caching, new_tokens are its tokens since the last sync (its last blocks get registered).")
      .def("sync",
           [](StepPlanner& p, const std::vector<int64_t>& ids, const std::vector<int64_t>& lengths,
              const std::vector<int64_t>& computed_target, const std::vector<int64_t>& computed_draft,
              const std::vector<int64_t>& rooms, const std::vector<std::vector<int32_t>>& new_tokens) {
             const std::size_t n = ids.size();
             if (lengths.size() != n || computed_target.size() != n || computed_draft.size() != n || rooms.size() != n)
               raise_status(error_status(StatusCode::kInvalidArgument, "StepPlanner.sync: the five lists must have "
                                         "one entry per request"));
             if (!new_tokens.empty() && new_tokens.size() != n)
               raise_status(error_status(StatusCode::kInvalidArgument, "StepPlanner.sync: new_tokens has ",
                                         new_tokens.size(), " entries for ", n, " requests"));
             std::vector<SequenceState> states(n);
             for (std::size_t i = 0; i < n; ++i) {
               states[i] = SequenceState{ids[i], lengths[i], computed_target[i], computed_draft[i], rooms[i]};
               if (!new_tokens.empty()) states[i].new_tokens = new_tokens[i];
             }
             check(p.sync(states));
           },
           py::arg("ids"), py::arg("lengths"), py::arg("computed_target"), py::arg("computed_draft"), py::arg("rooms"),
           py::arg("new_tokens") = std::vector<std::vector<int32_t>>{},
           "new_tokens (prefix caching only): per request, its tokens since the previous sync (all on the first).")
      .def("candidates", &StepPlanner::candidates, "Running requests, then the waiting ones this step may admit.")
      .def(
          "cached_prefix",
          [](const StepPlanner& p, int64_t id) { return planner_pair(p, id, &StepPlanner::cached_prefix); },
          py::arg("request"),
          "(target, draft): the KV tokens a waiting request would adopt from the prefix cache if admitted now "
          "(0, 0 for a running one).")
      .def(
          "candidate_work",
          [](const StepPlanner& p, int64_t id) { return planner_pair(p, id, &StepPlanner::candidate_work); },
          py::arg("request"),
          "(base_tokens, draft_catch_up) the policy is told: the length less the committed target / draft KV, "
          "a waiting request's taken as at least what it would adopt from the prefix cache.")
      .def("plan",
           [](StepPlanner& p, const std::vector<int64_t>& ids, const std::vector<int32_t>& ks,
              const std::vector<int32_t>& kinds) {
             if (ks.size() != ids.size() || kinds.size() != ids.size())
               raise_status(error_status(StatusCode::kInvalidArgument, "StepPlanner.plan: ids, ks and kinds must "
                                         "have one entry per decision"));
             std::vector<PlannedDecision> decisions(ids.size());
             for (std::size_t i = 0; i < ids.size(); ++i) {
               if (kinds[i] < 0 || kinds[i] > 2)
                 raise_status(error_status(StatusCode::kInvalidArgument, "StepPlanner.plan: kind ", kinds[i],
                                           " is not 0 (none), 1 (model-free) or 2 (draft model)"));
               decisions[i] = PlannedDecision{ids[i], ks[i], static_cast<ProposalKind>(kinds[i])};
             }
             StepPlan plan;
             check(p.plan(decisions, &plan));
             py::list items;
             for (WorkPlan& w : plan.items) {
               const bool draft = !w.draft_slots.empty() || w.draft_catch_up > 0;
               items.append(py::make_tuple(w.id, w.num_prefix, w.decide, w.k, w.nodes, w.fits,
                                           to_numpy(std::move(w.target_slots)), w.draft_catch_up,
                                           draft ? py::object(to_numpy(std::move(w.draft_slots))) : py::none(),
                                           w.cached_target, w.cached_draft));
             }
             PyReservation copies = to_python(Reservation{{}, std::move(plan.copies)});
             return py::make_tuple(items, copies.copies, plan.preempted, plan.admitted);
           },
           py::arg("ids"), py::arg("ks"), py::arg("kinds"),
           "(items, copies, preempted, admitted): items are (id, num_prefix, decide, k, nodes, fits, target_slots, "
           "draft_catch_up, draft_slots or None, cached_target, cached_draft); copies int32 [n, 4] (model, src_page, "
           "dst_page, num_tokens).")
      .def_property_readonly("prefix_hit_stats",
                             [](const StepPlanner& p) {
                               const PrefixHitStats& s = p.prefix_hit_stats();
                               py::dict d;
                               d["admissions"] = s.admissions;
                               d["query_tokens"] = s.query_tokens;
                               d["hit_tokens"] = s.hit_tokens;
                               return d;
                             },
                             "dict: admissions that looked up the prefix cache, their tokens, and the target "
                             "tokens found (since creation).")
      .def_property_readonly("running", &StepPlanner::running)
      .def_property_readonly("waiting", [](const StepPlanner& p) {
        return std::vector<RequestId>(p.waiting().begin(), p.waiting().end());
      })
      .def_property_readonly("num_waiting", [](const StepPlanner& p) { return p.waiting().size(); },
                             "How many requests wait in the queue.")
      .def_property_readonly("has_work", &StepPlanner::has_work)
      .def("draft_fed", &StepPlanner::draft_fed, py::arg("k"));
}

}  // namespace specd::py_bind
