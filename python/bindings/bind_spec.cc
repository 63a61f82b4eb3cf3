// Python binding of token trees, the draft-tree builder, sampling rules, Philox draws and
// verification (exports only; the rules are in token_tree.h, sampling.h, verify.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "errors.h"
#include "numpy_util.h"
#include "specd/draft_tree_builder.h"
#include "specd/philox.h"
#include "specd/sampling.h"
#include "specd/token_tree.h"
#include "specd/verify.h"

namespace py = pybind11;

namespace specd::py_bind {
namespace {

using FloatMatrix = py::array_t<float, py::array::c_style | py::array::forcecast>;

// A [rows, vocab] float32 view of a 2-D array (row stride = vocab).
ProbRows as_rows(const FloatMatrix& a, const char* name) {
  if (a.ndim() != 2)
    raise_status(error_status(StatusCode::kInvalidArgument, name, " must be 2-D [num_nodes, vocab], got ",
                              a.ndim(), " dimensions"));
  return ProbRows{a.data(), static_cast<int32_t>(a.shape(0)), static_cast<int32_t>(a.shape(1)), a.shape(1)};
}

py::tuple result_tuple(VerifyResult&& r) {
  const int32_t n = r.num_accepted;
  return py::make_tuple(to_numpy(std::move(r.tokens)), to_numpy(std::move(r.path)), n);
}

void check_node(const TokenTree& t, int32_t node) {
  if (node < 0 || node >= t.size())
    raise_status(error_status(StatusCode::kInvalidArgument, "node ", node, " is not in [0, ", t.size(), ")"));
}

DraftSampling parse_sampling(const std::string& s) {
  if (s == "without_replacement") return DraftSampling::kWithoutReplacement;
  if (s == "independent") return DraftSampling::kIndependent;
  raise_status(error_status(StatusCode::kInvalidArgument, "draft_sampling must be 'without_replacement' or "
                            "'independent', got '", s, "'"));
}

SamplingParams make_params(double temperature, int32_t top_k, double top_p, double min_p) {
  SamplingParams p{temperature, top_k, top_p, min_p};
  check(validate_sampling_params(p));
  return p;
}

void bind_tree(py::module_& m) {
  py::class_<TokenTree>(m, "TokenTree",
                        "Draft tokens as a tree rooted at the request's last token (node 0). "
                        "See docs/api.md for the rules.")
      .def(py::init<int32_t>(), py::arg("root_token"))
      .def_static("chain", [](int32_t root, const InArray<int32_t>& drafts) {
        return TokenTree::chain(root, as_span(drafts, "drafts"));
      }, py::arg("root_token"), py::arg("drafts"))
      .def_static("from_parents", [](const InArray<int32_t>& tokens, const InArray<int32_t>& parents) {
        TokenTree t;
        check(TokenTree::from_parents(as_span(tokens, "tokens"), as_span(parents, "parents"), &t));
        return t;
      }, py::arg("tokens"), py::arg("parents"))
      .def_static("from_candidates", &TokenTree::from_candidates, py::arg("root_token"),
                  py::arg("candidates"), py::arg("max_nodes") = -1)
      .def("add_node", [](TokenTree& t, int32_t parent, int32_t token) {
        check_node(t, parent);
        return t.add_node(parent, token);
      }, py::arg("parent"), py::arg("token"))
      .def("find_child", &TokenTree::find_child, py::arg("node"), py::arg("token"))
      .def("__len__", &TokenTree::size)
      .def_property_readonly("num_drafts", &TokenTree::num_drafts)
      .def_property_readonly("max_depth", &TokenTree::max_depth)
      .def_property_readonly("is_chain", &TokenTree::is_chain)
      .def_property_readonly("tokens", [](const TokenTree& t) { return to_numpy(std::vector<int32_t>(t.tokens())); })
      .def_property_readonly("parents", [](const TokenTree& t) { return to_numpy(std::vector<int32_t>(t.parents())); })
      .def_property_readonly("depths", [](const TokenTree& t) { return to_numpy(std::vector<int32_t>(t.depths())); },
                             "int32 [size]: depth of each node = its position offset from the root")
      .def("ancestor_mask", [](const TokenTree& t) {
        const py::ssize_t n = t.size(), words = t.mask_words();
        return to_numpy(t.ancestor_mask(), {n, words});
      }, "uint64 [size, ceil(size/64)]: bit j of row i set iff node i attends to node j")
      .def("leaves", [](const TokenTree& t) { return to_numpy(t.leaves()); })
      .def("paths", [](const TokenTree& t) {
        const auto leaves = static_cast<py::ssize_t>(t.leaves().size());
        return to_numpy(t.paths(), {leaves, t.max_depth() + 1});
      }, "int32 [num_leaves, max_depth + 1]: root-to-leaf node indices, padded with -1")
      .def("__repr__", [](const TokenTree& t) {
        return "TokenTree(" + std::to_string(t.num_drafts()) + " drafts, depth " + std::to_string(t.max_depth()) +
               (t.is_chain() ? ", chain)" : ")");
      });

  py::class_<DraftTreeBuilder>(m, "DraftTreeBuilder",
                               "EAGLE-2 style tree growth from a draft model's top-k candidates.")
      .def(py::init<int32_t>(), py::arg("root_token"))
      .def("expand", [](DraftTreeBuilder& b, int32_t node, const InArray<int32_t>& tokens,
                        const InArray<float>& probs) {
        check(b.expand(node, as_span(tokens, "tokens"), as_span(probs, "probs")));
      }, py::arg("node"), py::arg("tokens"), py::arg("probs"))
      .def("frontier", [](const DraftTreeBuilder& b, int32_t beam) { return to_numpy(b.frontier(beam)); },
           py::arg("beam"))
      .def("path_prob", [](const DraftTreeBuilder& b, int32_t node) {
        if (node < 0 || node >= b.size())
          raise_status(error_status(StatusCode::kInvalidArgument, "node ", node, " is not in [0, ", b.size(), ")"));
        return b.path_prob(node);
      }, py::arg("node"))
      .def("__len__", &DraftTreeBuilder::size)
      .def("replay", [](DraftTreeBuilder& b, const InArray<double>& record, int32_t forwards, int32_t width) {
        std::vector<int32_t> chain, fed;
        check(b.replay(as_span(record, "record"), forwards, width, &chain, &fed));
        return py::make_tuple(to_numpy(std::move(chain)), to_numpy(std::move(fed)));
      }, py::arg("record"), py::arg("forwards"), py::arg("width"),
      "Grows the builder (root only) from a device-grown tree's record, float64 [forwards, 2 w^2 + w] "
      "flattened (draft_tree_builder.h); returns (the draft's greedy chain: builder nodes, root first; "
      "int32 [(forwards - 1) w] the builder node fed at each of the runner's KV positions, -1 none).")
      .def("nodes", [](const DraftTreeBuilder& b) {
        std::vector<int32_t> parents, depths, tokens;
        std::vector<double> path_probs;
        for (int32_t v = 0; v < b.size(); ++v) {
          parents.push_back(b.parent(v));
          depths.push_back(b.depth(v));
          tokens.push_back(b.token(v));
          path_probs.push_back(b.path_prob(v));
        }
        return py::make_tuple(to_numpy(std::move(parents)), to_numpy(std::move(depths)), to_numpy(std::move(tokens)),
                              to_numpy(std::move(path_probs)));
      }, "(parents, depths, tokens, path_probs): int32 [size] of every node (the root's parent: -1), and "
         "float64 [size] its path_prob (the root's 1)")
      .def("build", [](const DraftTreeBuilder& b, int32_t budget) {
        std::vector<int32_t> kept;
        std::vector<float> probs;
        TokenTree t = b.build(budget, &kept, &probs);
        return py::make_tuple(std::move(t), to_numpy(std::move(kept)), to_numpy(std::move(probs)));
      }, py::arg("budget"), "(TokenTree, builder node of each tree node, path_prob of each tree node)");
}

void bind_sampling_and_verify(py::module_& m) {
  m.def("sampling_probs", [](const FloatMatrix& logits, double temperature, int32_t top_k, double top_p, double min_p) {
    const ProbRows rows = as_rows(logits, "logits");
    const SamplingParams params = make_params(temperature, top_k, top_p, min_p);
    std::vector<float> out(static_cast<std::size_t>(rows.rows) * static_cast<std::size_t>(rows.vocab));
    check(sampling_probs_rows(rows.data, rows.rows, rows.vocab, rows.stride, params, out.data()));
    return to_numpy(std::move(out), {rows.rows, rows.vocab});
  }, py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"));

  m.def("philox_uniform", &philox_uniform, py::arg("seed"), py::arg("request"), py::arg("step"),
        py::arg("position"), py::arg("draw"), "The uniform in [0, 1) of Philox4x32-10 for this key.");

  m.def("verify_greedy", [](const TokenTree& tree, const FloatMatrix& target) {
    VerifyResult r;
    check(verify_greedy(tree, as_rows(target, "target"), &r));
    return result_tuple(std::move(r));
  }, py::arg("tree"), py::arg("target"));

  m.def("verify_greedy_tokens", [](const TokenTree& tree, const InArray<int32_t>& target_tokens) {
    VerifyResult r;
    check(verify_greedy_tokens(tree, as_span(target_tokens, "target_tokens"), &r));
    return result_tuple(std::move(r));
  }, py::arg("tree"), py::arg("target_tokens"));

  m.def("verify_stochastic", [](const TokenTree& tree, const FloatMatrix& target, const py::object& draft,
                                const std::string& sampling, uint64_t seed, uint32_t request, uint32_t step,
                                uint32_t position) {
    const RngKey key{seed, request, step, position};
    VerifyResult r;
    if (draft.is_none()) {
      check(verify_stochastic(tree, as_rows(target, "target"), nullptr, DraftSampling::kIndependent, key, &r));
    } else {
      const FloatMatrix d = draft.cast<FloatMatrix>();
      const ProbRows dv = as_rows(d, "draft");
      check(verify_stochastic(tree, as_rows(target, "target"), &dv, parse_sampling(sampling), key, &r));
    }
    return result_tuple(std::move(r));
  }, py::arg("tree"), py::arg("target"), py::arg("draft"), py::arg("draft_sampling"), py::arg("seed"),
     py::arg("request"), py::arg("step"), py::arg("position"));

  m.def("sample_token", [](const InArray<float>& probs, uint64_t seed, uint32_t request, uint32_t step,
                           uint32_t position) {
    const Span<const float> p = as_span(probs, "probs");
    int32_t token = -1;
    check(sample_token(p.data(), static_cast<int32_t>(p.size()), RngKey{seed, request, step, position}, &token));
    return token;
  }, py::arg("probs"), py::arg("seed"), py::arg("request"), py::arg("step"), py::arg("position"));
}

}  // namespace

void bind_spec(py::module_& m) {
  bind_tree(m);
  bind_sampling_and_verify(m);
}

}  // namespace specd::py_bind
