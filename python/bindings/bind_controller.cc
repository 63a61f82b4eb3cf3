// Python binding of the speculation controller's pieces: AcceptanceEstimator, CostModel and
// optimize_goodput (exports only; the rules are in their headers).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "errors.h"
#include "numpy_util.h"
#include "specd/acceptance_estimator.h"
#include "specd/cost_model.h"
#include "specd/goodput_optimizer.h"

namespace py = pybind11;

namespace specd::py_bind {
namespace {

// One request as Python describes it: base tokens and a list of (gains, uses_draft, draft_base).
struct PyRequest {
  int32_t base_tokens;
  std::vector<std::vector<double>> gains;
  std::vector<bool> uses_draft;
  std::vector<int32_t> draft_base;
};

py::dict optimize(const std::vector<PyRequest>& requests, const CostModel& target, const CostModel* draft,
                  double fixed_seconds, double reference_goodput) {
  std::vector<std::vector<SpecOption>> options(requests.size());
  std::vector<SpecRequest> reqs(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const PyRequest& r = requests[i];
    if (r.gains.size() != r.uses_draft.size() || r.gains.size() != r.draft_base.size())
      raise_status(error_status(StatusCode::kInvalidArgument, "request ", i, ": gains, uses_draft and draft_base "
                                "need one entry per option"));
    for (std::size_t o = 0; o < r.gains.size(); ++o)
      options[i].push_back(SpecOption{Span<const double>(r.gains[o]), r.uses_draft[o], r.draft_base[o]});
    reqs[i] = SpecRequest{r.base_tokens, Span<const SpecOption>(options[i])};
  }
  Allocation a;
  check(optimize_goodput(reqs, StepCostModel{&target, draft, fixed_seconds, reference_goodput}, &a));
  py::dict d;
  d["k"] = a.k;
  d["option"] = a.option;
  d["expected_tokens"] = a.expected_tokens;
  d["expected_seconds"] = a.expected_seconds;
  d["goodput"] = a.goodput;
  d["plain_goodput"] = a.plain_goodput;
  d["objective"] = a.objective;
  d["draft_depth"] = a.draft_depth;
  return d;
}

}  // namespace

void bind_controller(py::module_& m) {
  py::class_<PyRequest>(m, "SpecRequest", "One request of a step for optimize_goodput.")
      .def(py::init([](int32_t base_tokens, std::vector<std::vector<double>> gains, std::vector<bool> uses_draft,
                       std::vector<int32_t> draft_base) {
        return PyRequest{base_tokens, std::move(gains), std::move(uses_draft), std::move(draft_base)};
      }), py::arg("base_tokens"), py::arg("gains"), py::arg("uses_draft"), py::arg("draft_base"))
      .def_readonly("base_tokens", &PyRequest::base_tokens);

  py::class_<CostModel>(m, "CostModel", "Forward time by token count, learned online (cost_model.h).")
      .def(py::init<>())
      .def("observe", [](CostModel& c, int64_t tokens, double seconds) { check(c.observe(tokens, seconds)); },
           py::arg("tokens"), py::arg("seconds"))
      .def("predict", &CostModel::predict, py::arg("tokens"))
      .def_property_readonly("has_data", &CostModel::has_data)
      .def_property_readonly("samples", &CostModel::samples)
      .def_property_readonly("slope", &CostModel::slope)
      .def_property_readonly("intercept", &CostModel::intercept);

  py::class_<AcceptanceEstimator>(m, "AcceptanceEstimator",
                                  "Per-depth acceptance by request and proposer, learned online.")
      .def(py::init([](int32_t num_proposers) {
        return AcceptanceEstimator(AcceptanceEstimatorConfig{}, num_proposers);
      }), py::arg("num_proposers"))
      .def("observe", [](AcceptanceEstimator& e, int64_t request, int32_t proposer, int32_t depth, int32_t accepted) {
        check(e.observe(request, proposer, depth, accepted));
      }, py::arg("request"), py::arg("proposer"), py::arg("depth"), py::arg("accepted"))
      .def("alphas", [](const AcceptanceEstimator& e, int64_t request, int32_t proposer, int32_t n) {
        std::vector<double> out(static_cast<std::size_t>(std::max(0, n)));
        check(e.alphas(request, proposer, Span<double>(out)));
        return out;
      }, py::arg("request"), py::arg("proposer"), py::arg("n"))
      .def("global_alpha", &AcceptanceEstimator::global_alpha, py::arg("proposer"), py::arg("depth"))
      .def("remove", &AcceptanceEstimator::remove, py::arg("request"));

  m.def("optimize_goodput", &optimize, py::arg("requests"), py::arg("target"), py::arg("draft") = nullptr,
        py::arg("fixed_seconds") = 0.0, py::arg("reference_goodput") = 0.0,
        "Draft tokens per request maximizing expected goodput (goodput_optimizer.h); with reference_goodput G > 0, "
        "maximizing E - G T instead. Returns a dict with k, option, expected_tokens, expected_seconds, goodput, "
        "plain_goodput, objective, draft_depth.");
}

}  // namespace specd::py_bind
