// Python binding of the speculation controller's pieces: AcceptanceEstimator, CostModel and
// optimize_goodput (exports only; the rules are in their headers).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include <string>
#include <vector>

#include "errors.h"
#include "numpy_util.h"
#include "specd/acceptance_estimator.h"
#include "specd/cost_model.h"
#include "specd/goodput_controller.h"
#include "specd/goodput_optimizer.h"
#include "specd/overhead_model.h"

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
                  double fixed_seconds, double reference_goodput, const std::vector<double>& host) {
  if (!host.empty() && host.size() != 3)
    raise_status(error_status(StatusCode::kInvalidArgument, "optimize_goodput: host must be (per_drafting_request, "
                              "per_draft_token, per_draft_forward) seconds, got ", host.size(), " values"));
  std::vector<std::vector<SpecOption>> options(requests.size());
  std::vector<SpecRequest> reqs(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const PyRequest& r = requests[i];
    if (r.gains.size() != r.uses_draft.size() || r.gains.size() != r.draft_base.size())
      raise_status(error_status(StatusCode::kInvalidArgument, "request ", i, ": gains, uses_draft and draft_base "
                                "need one entry per option"));
    for (std::size_t o = 0; o < r.gains.size(); ++o)
      options[i].push_back(SpecOption{Span<const double>(r.gains[o]), r.uses_draft[o], r.draft_base[o], 1});
    reqs[i] = SpecRequest{r.base_tokens, Span<const SpecOption>(options[i])};
  }
  Allocation a;
  StepCostModel cost{&target, draft, fixed_seconds, reference_goodput};
  if (!host.empty()) cost.host = HostCosts{host[0], host[1], host[2]};
  check(optimize_goodput(reqs, cost, &a));
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
      .def("explored_limit", &CostModel::explored_limit, py::arg("tokens"),
           "the largest token count the controller plans for from a step of `tokens` tokens")
      .def("measured", &CostModel::measured, "(mean tokens, mean seconds) of every bucket with data, by size")
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
      .def("alphas", [](const AcceptanceEstimator& e, int64_t request, int32_t proposer, int32_t n, bool explore) {
        std::vector<double> out(static_cast<std::size_t>(std::max(0, n)));
        check(e.alphas(request, proposer, Span<double>(out), explore));
        return out;
      }, py::arg("request"), py::arg("proposer"), py::arg("n"), py::arg("explore") = true,
         "explore=False: the data's depth-1 estimate even while the proposer is explored")
      .def("global_alpha", &AcceptanceEstimator::global_alpha, py::arg("proposer"), py::arg("depth"),
           py::arg("explore") = true)
      .def("explored", &AcceptanceEstimator::explored, py::arg("proposer"),
           "whether the proposer's depth 1 has had its exploration trials (acceptance_estimator.h)")
      .def("observe_tree", [](AcceptanceEstimator& e, int64_t request, int32_t proposer, double predicted,
                              int32_t accepted, std::optional<double> strength) {
        check(e.observe_tree(request, proposer, predicted, accepted, strength.value_or(predicted)));
      }, py::arg("request"), py::arg("proposer"), py::arg("predicted"), py::arg("accepted"),
         py::arg("strength") = py::none(), "strength: the candidate tree's summed node probabilities (default: predicted)")
      .def("tree_calibration", [](const AcceptanceEstimator& e, int32_t proposer, double strength,
                                  std::optional<int64_t> request) {
        return request ? e.tree_calibration(*request, proposer, strength) : e.tree_calibration(proposer, strength);
      }, py::arg("proposer"), py::arg("strength"), py::arg("request") = py::none(),
         "The proposer's tree calibration for trees of this strength (summed node probabilities), or the "
         "request's (times its own realised over expected accepted drafts).")
      .def("remove", &AcceptanceEstimator::remove, py::arg("request"));

  m.def("optimize_goodput", &optimize, py::arg("requests"), py::arg("target"), py::arg("draft") = nullptr,
        py::arg("fixed_seconds") = 0.0, py::arg("reference_goodput") = 0.0, py::arg("host") = std::vector<double>{},
        "Draft tokens per request maximizing expected goodput (goodput_optimizer.h); with reference_goodput G > 0, "
        "maximizing E - G T instead. host: the host seconds speculation adds per drafting request, per draft "
        "token and per draft forward (default none). Returns a dict with k, option, expected_tokens, "
        "expected_seconds, goodput, plain_goodput, objective, draft_depth.");

  py::class_<OverheadModel>(m, "OverheadModel",
                            "Host time per step outside the forwards by step shape, learned online (overhead_model.h).")
      .def(py::init<>())
      .def("observe", [](OverheadModel& o, double seconds, int64_t requests, int64_t drafting_requests,
                         int64_t draft_tokens, int64_t draft_forwards) {
        check(o.observe(StepShape{requests, drafting_requests, draft_tokens, draft_forwards}, seconds));
      }, py::arg("seconds"), py::arg("requests"), py::arg("drafting_requests") = 0, py::arg("draft_tokens") = 0,
         py::arg("draft_forwards") = 0)
      .def("predict", [](const OverheadModel& o, int64_t requests, int64_t drafting_requests, int64_t draft_tokens,
                         int64_t draft_forwards) {
        return o.predict(StepShape{requests, drafting_requests, draft_tokens, draft_forwards});
      }, py::arg("requests"), py::arg("drafting_requests") = 0, py::arg("draft_tokens") = 0,
         py::arg("draft_forwards") = 0)
      .def("fixed", &OverheadModel::fixed, py::arg("requests"), "the part that does not depend on speculation")
      .def_property_readonly("coefficients", [](const OverheadModel& o) {
        const auto& c = o.coefficients();
        return std::vector<double>(c.begin(), c.end());
      }, "[per step, per request, per drafting request, per draft token, per draft forward] seconds")
      .def_property_readonly("has_data", &OverheadModel::has_data)
      .def_property_readonly("samples", &OverheadModel::samples);

  py::class_<GoodputController>(m, "GoodputController",
                                "Per-step k and proposer per request maximizing goodput, learned online "
                                "(goodput_controller.h).")
      .def(py::init([](std::vector<bool> proposer_uses_draft, int32_t k_max, int32_t draft_tree_width) {
        GoodputControllerConfig config{std::move(proposer_uses_draft), k_max};
        config.draft_tree_width = draft_tree_width;
        return GoodputController(std::move(config));
      }), py::arg("proposer_uses_draft"), py::arg("k_max") = 8, py::arg("draft_tree_width") = 1)
      .def("size_trees", [](GoodputController& c, const std::vector<int64_t>& ids,
                            const std::vector<std::vector<double>>& path_probs,
                            const std::vector<std::vector<int32_t>>& parents, const std::vector<int32_t>& max_nodes,
                            int64_t other_tokens) {
        const std::size_t n = ids.size();
        if (path_probs.size() != n || parents.size() != n || max_nodes.size() != n)
          raise_status(error_status(StatusCode::kInvalidArgument, "GoodputController.size_trees: ids, path_probs, "
                                    "parents and max_nodes must have one entry per tree"));
        std::vector<TreeSizingRequest> trees(n);
        for (std::size_t i = 0; i < n; ++i)
          trees[i] = TreeSizingRequest{ids[i], Span<const double>(path_probs[i]), Span<const int32_t>(parents[i]),
                                       max_nodes[i]};
        std::vector<TreeSizing> sized;
        check(c.size_trees(trees, other_tokens, &sized));
        py::list out;
        for (const TreeSizing& t : sized) out.append(py::make_tuple(t.nodes, t.predicted));
        return out;
      }, py::arg("ids"), py::arg("path_probs"), py::arg("parents"), py::arg("max_nodes"), py::arg("other_tokens"),
         "Draft-model trees grown this step: per tree, (the nodes to verify, most valuable first; their "
         "uncalibrated gains summed) (goodput_controller.h).")
      .def("decide", [](GoodputController& c, const std::vector<int64_t>& ids, const std::vector<int32_t>& base_tokens,
                        const std::vector<int32_t>& k_max, const std::vector<int32_t>& draft_catch_up,
                        const std::vector<int64_t>& remaining_tokens,
                        const std::optional<std::vector<std::vector<std::vector<double>>>>& node_probs) {
        const std::size_t n = ids.size();
        if (base_tokens.size() != n || k_max.size() != n || draft_catch_up.size() != n || remaining_tokens.size() != n)
          raise_status(error_status(StatusCode::kInvalidArgument, "GoodputController.decide: the five lists must "
                                    "have one entry per request"));
        if (node_probs && node_probs->size() != n)
          raise_status(error_status(StatusCode::kInvalidArgument, "GoodputController.decide: node_probs has ",
                                    node_probs->size(), " entries for ", n, " requests"));
        std::vector<ControllerRequest> batch(n);
        for (std::size_t i = 0; i < n; ++i) {
          batch[i] = ControllerRequest{ids[i], base_tokens[i], k_max[i], draft_catch_up[i], remaining_tokens[i], {}};
          if (node_probs) batch[i].node_probs = Span<const std::vector<double>>((*node_probs)[i]);
        }
        std::vector<ControllerDecision> out;
        check(c.decide(batch, &out));
        std::vector<int32_t> k(n), proposer(n);
        std::vector<double> predicted(n);
        for (std::size_t i = 0; i < n; ++i) {
          k[i] = out[i].k;
          proposer[i] = out[i].proposer;
          predicted[i] = out[i].predicted_tokens;
        }
        return py::make_tuple(k, proposer, predicted);
      }, py::arg("ids"), py::arg("base_tokens"), py::arg("k_max"), py::arg("draft_catch_up"),
         py::arg("remaining_tokens"), py::arg("node_probs") = py::none(),
         "Returns (k, proposer, predicted_tokens) lists; proposer -1 where k == 0. node_probs: per request, per "
         "proposer, the candidate nodes' acceptance probabilities (an empty list where a proposer gives none).")
      .def("observe_tree", [](GoodputController& c, int64_t id, int32_t proposer, double predicted, int32_t accepted) {
        check(c.observe_tree(id, proposer, predicted, accepted));
      }, py::arg("request"), py::arg("proposer"), py::arg("predicted"), py::arg("accepted"))
      .def("observe", [](GoodputController& c, int64_t id, int32_t proposer, int32_t depth, int32_t accepted) {
        check(c.observe(id, proposer, depth, accepted));
      }, py::arg("request"), py::arg("proposer"), py::arg("depth"), py::arg("accepted"))
      .def("observe_forward", [](GoodputController& c, const std::string& model, int64_t tokens, double seconds) {
        if (model != "target" && model != "draft")
          raise_status(error_status(StatusCode::kInvalidArgument, "model must be 'target' or 'draft', got '", model, "'"));
        check(c.observe_forward(model == "target" ? ForwardKind::kTarget : ForwardKind::kDraft, tokens, seconds));
      }, py::arg("model"), py::arg("tokens"), py::arg("seconds"))
      .def("observe_overhead", [](GoodputController& c, double seconds, int64_t requests, int64_t drafting_requests,
                                  int64_t draft_tokens, int64_t draft_forwards) {
        check(c.observe_overhead(seconds, StepShape{requests, drafting_requests, draft_tokens, draft_forwards}));
      }, py::arg("seconds"), py::arg("requests"), py::arg("drafting_requests"), py::arg("draft_tokens"),
         py::arg("draft_forwards"),
         "One step's time outside the forwards and what it did: requests run, requests drafting, draft tokens "
         "verified, draft forwards (overhead_model.h).")
      .def("observe_step", [](GoodputController& c, int64_t tokens, double seconds, int64_t waiting) {
        check(c.observe_step(tokens, seconds, waiting));
      }, py::arg("tokens"), py::arg("seconds"), py::arg("waiting"),
         "One whole step: the tokens it emitted for all requests, its time and the requests left waiting for "
         "admission after it (the price of time under a backlog).")
      .def("observe_load", &GoodputController::observe_load, py::arg("waiting"), py::arg("max_batch"))
      .def("forget", &GoodputController::forget, py::arg("request"), py::arg("generated_tokens"))
      .def("forecast_batch", [](const GoodputController& c, int32_t current) {
        return c.load().batch(current, c.target_costs());
      }, py::arg("current"), "The load forecast's decode batch (load_forecast.h).")
      .def_property_readonly("overhead", &GoodputController::overhead, py::return_value_policy::reference_internal,
                             "The learned host time by step shape (OverheadModel).")
      .def_property_readonly("long_run_goodput", &GoodputController::long_run_goodput,
                             "Emitted tokens per second over the steps observed (decayed); 0 before any.")
      .def_property_readonly("backlog_share", &GoodputController::backlog_share,
                             "Decayed share of the observed steps that left requests waiting.")
      .def_property_readonly("last_typical_goodput", &GoodputController::last_typical_goodput,
                             "The last step's typical-step goodput G* (tokens/s; 0 before cost data).")
      .def_property_readonly("last_price", &GoodputController::last_price,
                             "The last step's price of time (tokens/s; 0 before cost data).")
      .def("price", &GoodputController::price, py::arg("g_star"),
           "The price of time (tokens/s) of a step whose typical step's optimal goodput is g_star.")
      .def_property_readonly("estimator", &GoodputController::estimator, py::return_value_policy::reference_internal)
      .def_property_readonly("target_costs", &GoodputController::target_costs, py::return_value_policy::reference_internal)
      .def_property_readonly("draft_costs", &GoodputController::draft_costs, py::return_value_policy::reference_internal);
}

}  // namespace specd::py_bind
