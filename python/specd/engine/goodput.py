"""The goodput policy: per step and per request, the number of draft tokens (and the
proposer) that maximizes expected goodput, learned online with nothing to tune (vLLM RFC
#4565 / SmartSpec, automated).

Per step it builds, for each request and each configured proposer, the expected gain of each
additional draft, prod_{m<=j} alpha_m, from the C++ AcceptanceEstimator. These are
per-request, per-proposer, per-depth acceptance rates, shrunk towards the proposer's global
rate for new requests. It then asks the C++ optimizer for the allocation that maximizes

    sum_i E[tokens_i(k_i)] / (T_target(sum_i base_i + k_i) + T_draft(k) + overhead)

with T_target and T_draft learned online (CostModel) from the engine's measured forwards, and
the overhead from its measured step times. k_i = 0 for every request is always a
candidate, so the policy never predicts a step slower than plain decoding. Token trees of
the model-free proposers are sized by the same k (their node budget), so their topology
adapts with the acceptance vectors. The math is written out in docs/controller.md.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specd import _core
from specd.engine.load_forecast import LoadForecast
from specd.engine.policy import Decision, StepRequest
from specd.engine.request import Request


class GoodputPolicy:
    """k per request and step maximizing expected goodput (see the module docstring)."""

    OVERHEAD_DECAY = 0.9  # weight kept by the step-overhead average
    UNSEEN = -1           # a request id the estimator has not seen: its answers are the priors

    def __init__(self, methods: Sequence[str], k_max: int = 8):
        self.methods = tuple(m for m in methods if m != "none") or ("none",)
        self.k_max = k_max
        self.estimator = _core.AcceptanceEstimator(len(self.methods))
        self.costs = {"target": _core.CostModel(), "draft": _core.CostModel()}
        self.overhead = 0.0
        self.steps = 0
        self.load = LoadForecast()

    def decide(self, batch: Sequence[StepRequest]) -> list[Decision]:
        for s in batch:
            self.load.arrive(s.request.id, s.base_tokens, s.remaining_tokens)
        if self.methods == ("none",) or not batch:
            return [Decision(0, "none") for _ in batch]
        all_gains = [self._gains(s.request.id, min(self.k_max, s.k_max)) for s in batch]
        # The batch's typical step: decode only, every draft in sync. Its optimal goodput is
        # the price of time for this step (goodput_optimizer.h, "Objective").
        steady = self._optimize([self._steady(s, g) for s, g in zip(batch, all_gains)])
        typical = all(s.base_tokens == 1 and s.draft_catch_up <= 1 for s in batch)
        invest = self._worth_catching_up(batch, all_gains, steady)
        requests = []
        for s, gains, ok in zip(batch, all_gains, invest):
            # A request whose draft catch-up does not pay keeps its model-free options only.
            usable = [g if (m != "draft" or ok) else [] for m, g in zip(self.methods, gains)]
            requests.append(self._request(s, usable))
        plan = steady if typical else self._optimize(requests, reference=steady["goodput"])
        decisions = []
        for gains, k, option in zip(all_gains, plan["k"], plan["option"]):
            method = self.methods[option] if option >= 0 else self.methods[0]
            predicted = 1.0 + (sum(gains[option][:k]) if k > 0 else 0.0)
            decisions.append(Decision(int(k), method, predicted))
        return decisions

    def _gains(self, request_id: int, cap: int) -> list[list[float]]:
        """Per proposer, the expected gain of each draft: prod_{m<=j} alpha_m."""
        return [np.cumprod(self.estimator.alphas(request_id, p, cap)).tolist() if cap > 0 else []
                for p in range(len(self.methods))]

    def _steady(self, s: StepRequest, gains: list[list[float]]):
        """The request in a decode-only step with its draft KV in sync."""
        return _core.SpecRequest(1, gains, [m == "draft" for m in self.methods], [1] * len(gains))

    def _request(self, s: StepRequest, gains: list[list[float]]):
        bases = [self._draft_base(s, g) for g in gains]
        return _core.SpecRequest(s.base_tokens, gains, [m == "draft" for m in self.methods], bases)

    def _optimize(self, requests, reference: float = 0.0) -> dict:
        return _core.optimize_goodput(requests, self.costs["target"],
                                      self.costs["draft"] if "draft" in self.methods else None, self.overhead,
                                      reference)

    def _worth_catching_up(self, batch: Sequence[StepRequest], all_gains, steady: dict) -> list[bool]:
        """Which requests should let the draft model catch up on tokens it has not seen.

        Catching up is an investment. Every request of the batch waits once for the draft
        to process the request's missing tokens (cost: n x wait). It lets the request draft
        in its remaining steps, which will run at the batch size the load forecast expects
        (LoadForecast: the current batch, grown by arrivals or a queue). The plan of such a
        steady step (decode only, drafts in sync; requests beyond the current batch get the
        proposer's prior acceptance) gives the request's drafts per step k and extra tokens
        per step Δ. Their marginal step time δ comes from the learned costs. Each step the
        batch then gains Δ/G - δ seconds (the time its extra tokens would take at that
        step's goodput G, minus what its drafts add), over the request's S remaining steps.
        Invest iff S (Δ/G - δ) > wait. Requests already in sync always may draft."""
        behind = [max(0, s.draft_catch_up - 1) for s in batch]
        if "draft" not in self.methods or not any(behind):
            return [True] * len(batch)
        target, draft = self.costs["target"], self.costs["draft"]
        forecast = self.load.batch(len(batch), target)
        if forecast > len(batch):
            typical = self._gains(self.UNSEEN, max((len(g[0]) for g in all_gains), default=0))
            extra = [self._steady(None, typical)] * (forecast - len(batch))
            steady = self._optimize([self._steady(s, g) for s, g in zip(batch, all_gains)] + extra)
        d = self.methods.index("draft")
        goodput = steady["goodput"]
        verified = forecast + sum(steady["k"])
        users = sum(1 for k, o in zip(steady["k"], steady["option"]) if k > 0 and o == d)
        draft_token = max(0.0, draft.predict(users + 1) - draft.predict(users))
        # Before the draft's costs have a slope, assume its tokens cost what the target's do,
        # scaled by the two models' forward times.
        ratio = draft.predict(1) / target.predict(1) if target.predict(1) > 0 else 0.0
        invest = []
        for s, gains, k, option, b in zip(batch, all_gains, steady["k"], steady["option"], behind):
            if b == 0:
                invest.append(True)
                continue
            if option != d or k == 0 or goodput <= 0:
                invest.append(False)
                continue
            extra_tokens = sum(gains[d][:k])
            delta = max(0.0, target.predict(verified) - target.predict(verified - k)) + k * draft_token
            per_step = extra_tokens / goodput - delta
            steps_left = s.remaining_tokens / (1.0 + extra_tokens)
            base = users + 1
            wait = max(draft.predict(base + b) - draft.predict(base),
                       ratio * (target.predict(verified + b) - target.predict(verified)), 0.0)
            invest.append(steps_left * per_step > wait)
        return invest

    @staticmethod
    def _draft_base(s: StepRequest, gains: list[float]) -> int:
        """Draft tokens charged to the step for the request's catch-up: spread over the steps
        the request still has (at the expected tokens per step), since it is paid once and
        enables drafting for the rest of the request (when _worth_catching_up said so)."""
        behind = max(0, s.draft_catch_up - 1)
        steps_left = max(1.0, s.remaining_tokens / (1.0 + sum(gains)))
        return 1 + int(np.ceil(behind / steps_left))

    def observe(self, request: Request, method: str, depth: int, accepted: int) -> None:
        if method in self.methods and depth > 0:
            self.estimator.observe(request.id, self.methods.index(method), depth, accepted)

    def observe_forward(self, model: str, tokens: int, seconds: float) -> None:
        self.load.tick(seconds)
        if tokens > 0:
            self.costs[model].observe(tokens, seconds)

    def observe_load(self, waiting: int, max_batch: int) -> None:
        """Requests queued beyond this step's batch, and the batch limit (LoadForecast)."""
        self.load.queue(waiting, max_batch)

    def observe_overhead(self, seconds: float) -> None:
        """Time of a step spent outside the model forwards (scheduling, proposing, verifying)."""
        self.load.tick(seconds)
        d = self.OVERHEAD_DECAY if self.steps else 0.0
        self.overhead = d * self.overhead + (1 - d) * max(0.0, seconds)
        self.steps += 1

    def forget(self, request: Request) -> None:
        self.estimator.remove(request.id)
        self.load.finish(request.id, len(request.output_ids))
