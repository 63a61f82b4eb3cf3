// Python binding of the model-free proposers (proposer.h, ngram_proposer.h,
// suffix_proposer.h): exports only.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "errors.h"
#include "numpy_util.h"
#include "specd/ngram_proposer.h"
#include "specd/suffix_proposer.h"

namespace py = pybind11;

namespace specd::py_bind {
namespace {

// The trees of one propose call, as numpy arrays (CSR over requests).
struct PyProposals {
  py::array_t<int32_t> offsets;    // [num_requests + 1]
  py::array_t<int32_t> tokens;     // [total nodes]
  py::array_t<int32_t> parents;    // [total nodes], local indices, -1 for roots
  py::array_t<float> node_probs;   // [total nodes]
};

// An int applies to every request; a sequence gives one value per request.
std::vector<int32_t> per_request(const py::object& value, std::size_t n, const char* name) {
  if (py::isinstance<py::int_>(value)) return std::vector<int32_t>(n, value.cast<int32_t>());
  std::vector<int32_t> v = value.cast<std::vector<int32_t>>();
  if (v.size() != n)
    raise_status(error_status(StatusCode::kInvalidArgument, name, " has ", v.size(), " values for ", n, " requests"));
  return v;
}

PyProposals propose(Proposer& p, const InArray<int64_t>& ids, const py::object& max_depth,
                    const py::object& max_nodes) {
  const Span<const RequestId> id_span = as_span(ids, "ids");
  const std::vector<int32_t> depth = per_request(max_depth, id_span.size(), "max_depth");
  const std::vector<int32_t> nodes = per_request(max_nodes, id_span.size(), "max_nodes");
  TokenTreeBatch out;
  check(p.propose_batch(id_span, depth, nodes, &out));
  return PyProposals{to_numpy(std::move(out.offsets)), to_numpy(std::move(out.tokens)),
                     to_numpy(std::move(out.parents)), to_numpy(std::move(out.node_probs))};
}

TokenTree tree_of(const PyProposals& p, py::ssize_t r) {
  const py::ssize_t n = p.offsets.size() - 1;
  if (r < 0) r += n;
  if (r < 0 || r >= n) throw py::index_error("proposal " + std::to_string(r) + " out of range");
  const int32_t b = p.offsets.at(r), e = p.offsets.at(r + 1);
  TokenTree t;
  check(TokenTree::from_parents(Span<const int32_t>(p.tokens.data() + b, static_cast<std::size_t>(e - b)),
                                Span<const int32_t>(p.parents.data() + b, static_cast<std::size_t>(e - b)), &t));
  return t;
}

NgramOrder parse_order(const std::string& order) {
  if (order == "recent") return NgramOrder::kRecent;
  if (order == "frequent") return NgramOrder::kFrequent;
  raise_status(error_status(StatusCode::kInvalidArgument, "order must be 'recent' or 'frequent', got '", order, "'"));
}

}  // namespace

void bind_proposers(py::module_& m) {
  py::class_<PyProposals>(m, "Proposals", "Draft trees of one propose() call, one per request (CSR).")
      .def_readonly("offsets", &PyProposals::offsets, "int32 [num_requests + 1]")
      .def_readonly("tokens", &PyProposals::tokens, "int32 [total nodes]")
      .def_readonly("parents", &PyProposals::parents, "int32 [total nodes], local to each tree")
      .def_readonly("node_probs", &PyProposals::node_probs,
                    "float32 [total nodes]: estimated probability that each node is accepted")
      .def("__len__", [](const PyProposals& p) { return p.offsets.size() - 1; })
      .def("tree", &tree_of, py::arg("index"), "The TokenTree of request `index`.")
      .def("__getitem__", &tree_of)
      .def("expected_accepted", [](const PyProposals& p, py::ssize_t r) {
        const TokenTree t = tree_of(p, r);
        const int32_t b = p.offsets.at(r < 0 ? r + p.offsets.size() - 1 : r);
        double sum = 0;
        for (int32_t i = 1; i < t.size(); ++i) sum += p.node_probs.at(b + i);
        return sum;
      }, py::arg("index"), "Sum of the drafts' node_probs: the proposer's expected accepted tokens.");

  py::class_<Proposer>(m, "Proposer", "Model-free draft proposer for many requests (see docs/api.md).")
      .def("add_request", [](Proposer& p, RequestId id, const InArray<int32_t>& prompt) {
        check(p.add_request(id, as_span(prompt, "prompt")));
      }, py::arg("request"), py::arg("prompt"))
      .def("append", [](Proposer& p, RequestId id, const InArray<int32_t>& tokens) {
        check(p.append(id, as_span(tokens, "tokens")));
      }, py::arg("request"), py::arg("tokens"))
      .def("truncate", [](Proposer& p, RequestId id, int64_t len) { check(p.truncate(id, len)); },
           py::arg("request"), py::arg("new_len"))
      .def("remove_request", [](Proposer& p, RequestId id, bool finished) {
        check(p.remove_request(id, finished ? RemoveReason::kFinished : RemoveReason::kAborted));
      }, py::arg("request"), py::arg("finished") = true,
         "finished=True: the request completed (its output may feed a cache); False: aborted.")
      .def("__contains__", &Proposer::contains)
      .def("history_length", [](const Proposer& p, RequestId id) {
        const int64_t n = p.history_length(id);
        if (n < 0) raise_status(error_status(StatusCode::kNotFound, "unknown request ", id));
        return n;
      }, py::arg("request"))
      .def("propose", &propose, py::arg("requests"), py::arg("max_depth"), py::arg("max_nodes"),
           "One draft tree per request: depth <= max_depth, at most max_nodes drafts (ints apply to "
           "all requests, sequences give one value each).");

  py::class_<NgramProposer, Proposer>(m, "NgramProposer", "Prompt-lookup (n-gram) proposer.")
      .def(py::init([](int32_t n_min, int32_t n_max, int32_t max_candidates, const std::string& order,
                       int32_t max_scan) {
        NgramConfig c;
        c.n_min = n_min;
        c.n_max = n_max;
        c.max_candidates = max_candidates;
        c.order = parse_order(order);
        c.max_scan = max_scan;
        std::unique_ptr<NgramProposer> p;
        check(NgramProposer::create(c, &p));
        return p;
      }), py::arg("n_min") = 1, py::arg("n_max") = 4, py::arg("max_candidates") = 4,
          py::arg("order") = "recent", py::arg("max_scan") = 32)
      .def_property_readonly("num_requests", &NgramProposer::num_requests)
      .def_property_readonly("memory_bytes", &NgramProposer::memory_bytes);

  py::class_<SuffixProposer, Proposer>(m, "SuffixProposer",
                                       "SuffixDecoding-style proposer (own history + global cache).")
      .def(py::init([](int32_t max_match, float spec_factor, float min_token_prob, int64_t cache_max_tokens,
                       int32_t cache_epochs, bool cache_prompts, int32_t count_cap) {
        SuffixConfig c;
        c.max_match = max_match;
        c.spec_factor = spec_factor;
        c.min_token_prob = min_token_prob;
        c.cache_max_tokens = cache_max_tokens;
        c.cache_epochs = cache_epochs;
        c.cache_prompts = cache_prompts;
        c.count_cap = count_cap;
        std::unique_ptr<SuffixProposer> p;
        check(SuffixProposer::create(c, &p));
        return p;
      }), py::arg("max_match") = 32, py::arg("spec_factor") = 1.0f, py::arg("min_token_prob") = 0.1f,
          py::arg("cache_max_tokens") = int64_t{1} << 20, py::arg("cache_epochs") = 4,
          py::arg("cache_prompts") = false, py::arg("count_cap") = 1024)
      .def_property_readonly("num_requests", &SuffixProposer::num_requests)
      .def_property_readonly("num_cache_epochs", &SuffixProposer::num_cache_epochs)
      .def_property_readonly("cache_tokens", &SuffixProposer::cache_tokens)
      .def_property_readonly("memory_bytes", &SuffixProposer::memory_bytes);
}

}  // namespace specd::py_bind
