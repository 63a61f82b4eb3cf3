"""The goodput policy: per step and per request, the number of draft tokens (and the
proposer) that maximizes expected goodput, learned online with nothing to tune (vLLM RFC
#4565 / SmartSpec, automated).

All of it is the C++ GoodputController (cpp/include/specd/goodput_controller.h), which a C++
server can embed without Python; this class adapts it to the policy protocol (proposer names
to indices, StepRequest fields to lists). Per step the controller
- builds, for each request and proposer, the expected gain of each additional draft,
  prod_{m<=j} alpha_m, from per-request, per-proposer, per-depth acceptance learned online;
- prices the step at the optimal goodput of the batch's typical step (decode only, drafts
  in sync), lowered towards the engine's long-run goodput (emitted tokens over all step
  time, prefills included) as far as requests wait for admission, and maximizes E - G T
  with the C++ optimizer, where
  T = T_target(sum_i base_i + k_i) + T_draft(k) + host comes from costs learned from the
  engine's measured forwards and, for the host time outside them, from each step's shape
  (what speculation adds per drafting request, draft token and draft forward is priced, not
  averaged into every plan alike); k_i = 0 for every request is always a candidate;
- lets the draft model catch up on a request only when the investment pays at the batch the
  load forecast expects (the queue, and Little's law on measured arrivals).
Token trees of the model-free proposers (n-gram, suffix) are sized by the same k, their node
budget, with gains from the step's own candidate tree: the engine probes the proposer with a
budget of k_max, and the j-th draft's gain is the j-th most probable node's probability times
the request's learned calibration (realised over predicted accepted drafts, shrunk towards
the proposer's). The budget, and
with it the tree's depth and width, thus follows each request's evidence in each step.
Draft-model trees (draft_tree_width > 1) get their depth k from the per-depth acceptance
(with the draft forwards' token counts, w per frontier, priced), and after the draft grew them, the
nodes to verify (size_trees): the draft's most probable path gets the per-depth acceptance,
other nodes a share scaled by the draft's confidence, calibrated as above. The
maths is in docs/controller.md.
"""

from __future__ import annotations

from typing import Sequence

from specd import _core
from specd.engine.policy import Decision, StepRequest, StepShape
from specd.engine.request import Request


class GoodputPolicy:
    """k per request and step maximizing expected goodput (see the module docstring)."""

    def __init__(self, methods: Sequence[str], k_max: int = 8, draft_tree_width: int = 1):
        self.methods = tuple(m for m in methods if m != "none") or ("none",)
        self.k_max = k_max
        self.controller = _core.GoodputController([m == "draft" for m in self.methods], k_max, draft_tree_width)
        self.wants_node_probs = any(m in ("ngram", "suffix") for m in self.methods)

    @property
    def estimator(self):
        return self.controller.estimator

    @property
    def costs(self) -> dict:
        return {"target": self.controller.target_costs, "draft": self.controller.draft_costs}

    @property
    def overhead(self):
        """The learned host time by step shape (specd.OverheadModel: coefficients, predict)."""
        return self.controller.overhead

    def decide(self, batch: Sequence[StepRequest]) -> list[Decision]:
        if self.methods == ("none",) or not batch:
            return [Decision(0, "none") for _ in batch]
        probs = None
        if self.wants_node_probs:
            # per request: one list per method (ignored for "draft"), or [] where not probed
            probs = [[] if s.node_probs is None else [list(map(float, s.node_probs.get(m, ()))) for m in self.methods]
                     for s in batch]
        ks, proposers, predicted = self.controller.decide(
            [s.request.id for s in batch], [s.base_tokens for s in batch], [s.k_max for s in batch],
            [s.draft_catch_up for s in batch], [min(s.remaining_tokens, 1 << 62) for s in batch], probs)
        return [Decision(k, self.methods[p] if p >= 0 else self.methods[0], t)
                for k, p, t in zip(ks, proposers, predicted)]

    def size_trees(self, requests: Sequence[Request], path_probs: Sequence[Sequence[float]],
                   parents: Sequence[Sequence[int]], max_nodes: Sequence[int],
                   other_tokens: int) -> list[tuple[list[int], float]]:
        """Draft-model trees grown this step (draft_tree_width > 1): per tree, the nodes to verify
        (indices into its grown nodes, most valuable first) and their predicted accepted drafts,
        from the per-depth acceptance shared by the draft's confidence, calibrated, at this
        step's price on top of ``other_tokens`` the target verifies anyway."""
        return self.controller.size_trees([r.id for r in requests], [list(map(float, p)) for p in path_probs],
                                          [list(map(int, p)) for p in parents], list(max_nodes), other_tokens)

    def observe(self, request: Request, method: str, depth: int, accepted: int) -> None:
        if method in self.methods and depth > 0 and self.methods != ("none",):
            self.controller.observe(request.id, self.methods.index(method), depth, accepted)

    def observe_tree(self, request: Request, method: str, predicted: float, accepted: int) -> None:
        """A verified tree of a model-free proposer: its drafts' node probabilities summed to
        `predicted`; `accepted` drafts passed (the request's and the proposer's calibration)."""
        if method in self.methods:
            self.controller.observe_tree(request.id, self.methods.index(method), predicted, accepted)

    def observe_forward(self, model: str, tokens: int, seconds: float) -> None:
        self.controller.observe_forward(model, tokens, seconds)

    def observe_load(self, waiting: int, max_batch: int) -> None:
        """Requests queued beyond this step's batch, and the batch limit (load_forecast.h)."""
        self.controller.observe_load(waiting, max_batch)

    def observe_overhead(self, seconds: float, shape: StepShape) -> None:
        """Time of a step spent outside the model forwards (scheduling, proposing, verifying),
        and what the step did."""
        self.controller.observe_overhead(seconds, shape.requests, shape.drafting_requests, shape.draft_tokens,
                                         shape.draft_forwards)

    def observe_step(self, tokens: int, seconds: float, waiting: int) -> None:
        """One whole step: the tokens it emitted for all requests, its time and the requests
        left waiting for admission after it (the price of time under a backlog)."""
        self.controller.observe_step(tokens, seconds, waiting)

    def metrics(self) -> dict:
        """The controller's view of the load at the last step, in tokens/s: the typical
        (decode-only) step's optimal goodput G*, the long-run goodput G_run, the share of
        recent steps that left requests waiting, and the price of time it planned with; and
        the host time outside the forwards it has learnt, in ms (host_ms: per step, per
        request, per drafting request, per draft token, per draft forward)."""
        c = self.controller
        host = dict(zip(("per_step", "per_request", "per_drafting_request", "per_draft_token", "per_draft_forward"),
                        (1e3 * x for x in c.overhead.coefficients)))
        return {"typical_goodput": c.last_typical_goodput, "long_run_goodput": c.long_run_goodput,
                "backlog_share": c.backlog_share, "price": c.last_price, "host_ms": host}

    def forget(self, request: Request) -> None:
        self.controller.forget(request.id, len(request.output_ids))
