"""Recording what a speculation policy was told and what it decided, and replaying it.

``TracedPolicy(policy)`` wraps any policy (built-in or plugin) and records every call the
engine makes to it, in order, as JSON-ready events:
- ``decide``: per request its id, base tokens, k cap, draft catch-up, remaining tokens and
  (for policies that want them) the candidate trees' node probabilities; and the decisions
  (k, method, predicted tokens);
- ``size_trees`` (draft-model trees): the grown trees and the nodes chosen;
- the feedback: ``observe``, ``observe_tree``, ``observe_forward`` (measured forward times),
  ``observe_load``, ``observe_overhead`` (the host time and the step's shape), ``observe_step``
  and ``forget``.
Optional hooks are present on the wrapper exactly when the wrapped policy has them, so the
engine treats both alike.

``replay(events, policy)`` feeds a recorded trace to a fresh policy and returns, per
decision call, what was recorded and what the policy decides now. The goodput controller is
deterministic, so a fresh one replays its own trace exactly; with a changed controller the
differences show which decisions the change moves on the recorded inputs (measured times
and acceptances of a real run). ``forward_times(events)`` lists the measured forward times
by model and token count. ``specd bench load --trace DIR`` writes one trace per run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from specd.engine.policy import Decision, SpeculationPolicy, StepRequest, StepShape, overhead_hook
from specd.errors import InvalidArgumentError

_OPTIONAL = ("observe_load", "observe_overhead", "observe_step", "observe_tree", "size_trees")
# The optional hooks whose arguments are plain numbers: the event fields, in call order.
_HOOK_ARGS = {"observe_load": ("waiting", "max_batch"), "observe_step": ("tokens", "seconds", "waiting")}
_SHAPE = ("requests", "drafting_requests", "draft_tokens", "draft_forwards")  # StepShape's fields, in order


def _floats(xs) -> list[float]:
    return [float(x) for x in xs]


class TracedPolicy:
    """A policy that records every call to ``inner`` in ``events`` (module docstring)."""

    def __init__(self, inner: SpeculationPolicy):
        self.inner = inner
        self.events: list[dict[str, Any]] = []
        self.methods = inner.methods
        if getattr(inner, "wants_node_probs", False):
            self.wants_node_probs = True
        if callable(getattr(inner, "metrics", None)):
            self.metrics = inner.metrics
        for name in _OPTIONAL:
            if callable(getattr(inner, name, None)):
                setattr(self, name, getattr(self, "_" + name))
        self._inner_overhead = overhead_hook(inner)

    def decide(self, batch: Sequence[StepRequest]) -> list[Decision]:
        out = self.inner.decide(batch)
        self.events.append({
            "call": "decide",
            "requests": [{"id": s.request.id, "base_tokens": s.base_tokens, "k_max": s.k_max,
                          "draft_catch_up": s.draft_catch_up, "remaining_tokens": s.remaining_tokens,
                          "node_probs": None if s.node_probs is None
                          else {m: _floats(p) for m, p in s.node_probs.items()}} for s in batch],
            "decisions": [[d.k, d.method, float(d.predicted_tokens)] for d in out]})
        return out

    def observe(self, request, method: str, depth: int, accepted: int) -> None:
        self.events.append({"call": "observe", "request": request.id, "method": method, "depth": int(depth),
                            "accepted": int(accepted)})
        self.inner.observe(request, method, depth, accepted)

    def observe_forward(self, model: str, tokens: int, seconds: float) -> None:
        self.events.append({"call": "observe_forward", "model": model, "tokens": int(tokens),
                            "seconds": float(seconds)})
        self.inner.observe_forward(model, tokens, seconds)

    def forget(self, request) -> None:
        self.events.append({"call": "forget", "request": request.id, "generated": len(request.output_ids)})
        self.inner.forget(request)

    def _observe_load(self, waiting: int, max_batch: int) -> None:
        self.events.append({"call": "observe_load", "waiting": int(waiting), "max_batch": int(max_batch)})
        self.inner.observe_load(waiting, max_batch)

    def _observe_overhead(self, seconds: float, shape: StepShape) -> None:
        self.events.append({"call": "observe_overhead", "seconds": float(seconds),
                            "shape": [int(getattr(shape, f)) for f in _SHAPE]})
        self._inner_overhead(seconds, shape)

    def _observe_step(self, tokens: int, seconds: float, waiting: int) -> None:
        self.events.append({"call": "observe_step", "tokens": int(tokens), "seconds": float(seconds),
                            "waiting": int(waiting)})
        self.inner.observe_step(tokens, seconds, waiting)

    def _observe_tree(self, request, method: str, predicted: float, accepted: int) -> None:
        self.events.append({"call": "observe_tree", "request": request.id, "method": method,
                            "predicted": float(predicted), "accepted": int(accepted)})
        self.inner.observe_tree(request, method, predicted, accepted)

    def _size_trees(self, requests, path_probs, parents, max_nodes, other_tokens: int):
        out = self.inner.size_trees(requests, path_probs, parents, max_nodes, other_tokens)
        self.events.append({
            "call": "size_trees", "requests": [r.id for r in requests], "path_probs": [_floats(p) for p in path_probs],
            "parents": [[int(x) for x in p] for p in parents], "max_nodes": [int(x) for x in max_nodes],
            "other_tokens": int(other_tokens), "sizings": [[[int(v) for v in nodes], float(pred)] for nodes, pred in out]})
        return out

    def save(self, path: Union[str, Path], **header) -> None:
        """Writes ``{**header, "events": [...]}`` as JSON."""
        Path(path).write_text(json.dumps({**header, "events": self.events}))


@dataclass
class _Request:
    """What a policy reads of a request: its id and how many tokens it generated."""

    id: int
    output_ids: list = field(default_factory=list)


@dataclass
class ReplayedDecision:
    index: int          # position of the call in the trace
    call: str           # "decide" or "size_trees"
    recorded: list      # decide: [[k, method, predicted], ...]; size_trees: [[nodes, predicted], ...]
    replayed: list      # the same, from the replaying policy

    @property
    def same(self) -> bool:
        """Same choices (k and method, or nodes); predictions may differ in the last bits."""
        if self.call == "decide":
            return [r[:2] for r in self.recorded] == [r[:2] for r in self.replayed]
        return [r[0] for r in self.recorded] == [r[0] for r in self.replayed]


def load_trace(path: Union[str, Path]) -> dict:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("events"), list):
        raise InvalidArgumentError(f"{path}: not a policy trace (a JSON object with an 'events' list)")
    return data


def replay(events: Sequence[dict], policy: SpeculationPolicy) -> list[ReplayedDecision]:
    """Feeds ``events`` (TracedPolicy.events) to ``policy``; one ReplayedDecision per decide or
    size_trees call, in order. Hooks the policy lacks are skipped, as the engine would."""
    requests: dict[int, _Request] = {}

    def req(rid: int) -> _Request:
        return requests.setdefault(rid, _Request(rid))

    out: list[ReplayedDecision] = []
    hook = overhead_hook(policy)
    for i, e in enumerate(events):
        call = e.get("call")
        if call == "decide":
            batch = [StepRequest(req(r["id"]), base_tokens=r["base_tokens"], k_max=r["k_max"],
                                 draft_catch_up=r["draft_catch_up"], remaining_tokens=r["remaining_tokens"],
                                 node_probs=r["node_probs"]) for r in e["requests"]]
            got = policy.decide(batch)
            out.append(ReplayedDecision(i, call, e["decisions"],
                                        [[d.k, d.method, float(d.predicted_tokens)] for d in got]))
        elif call == "size_trees":
            fn = getattr(policy, "size_trees", None)
            if fn is None:
                raise InvalidArgumentError(f"event {i}: the trace sizes draft trees; the replaying policy cannot")
            got = fn([req(r) for r in e["requests"]], e["path_probs"], e["parents"], e["max_nodes"],
                     e["other_tokens"])
            out.append(ReplayedDecision(i, call, e["sizings"], [[list(n), float(p)] for n, p in got]))
        elif call == "observe":
            policy.observe(req(e["request"]), e["method"], e["depth"], e["accepted"])
        elif call == "observe_forward":
            policy.observe_forward(e["model"], e["tokens"], e["seconds"])
        elif call == "forget":
            r = req(e["request"])
            r.output_ids = [0] * e["generated"]
            policy.forget(r)
            del requests[r.id]
        elif call == "observe_tree":
            if hasattr(policy, call):
                policy.observe_tree(req(e["request"]), e["method"], e["predicted"], e["accepted"])
        elif call == "observe_overhead":
            if hook is not None:  # traces older than step shapes: a shapeless step (constant term only)
                hook(e["seconds"], StepShape(*e.get("shape", ())))
        elif call in _HOOK_ARGS:
            if hasattr(policy, call):
                getattr(policy, call)(*(e[a] for a in _HOOK_ARGS[call]))
        else:
            raise InvalidArgumentError(f"event {i}: unknown call {call!r}")
    return out


def forward_times(events: Sequence[dict]) -> dict[tuple[str, int], list[float]]:
    """Measured forward times in a trace: (model, tokens) -> seconds of each such forward, in
    order (the cost curve the policy learned from)."""
    out: dict[tuple[str, int], list[float]] = {}
    for e in events:
        if e.get("call") == "observe_forward":
            out.setdefault((e["model"], e["tokens"]), []).append(e["seconds"])
    return dict(sorted(out.items()))


def first_difference(replayed: Sequence[ReplayedDecision]) -> Optional[ReplayedDecision]:
    """The first decision that differs from the recording (None: all the same)."""
    return next((r for r in replayed if not r.same), None)
