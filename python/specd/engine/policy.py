"""Speculation policies: how many draft tokens (k) each request gets in each step, and with
which proposer when several are configured.

The scheduler asks the policy once per step, for the requests about to run and the waiting
ones it may admit (:meth:`SpeculationPolicy.decide`). It then reports what happened: per
request, how deep the proposal went and how many drafts were accepted (:meth:`observe`);
per forward pass, how
many tokens it processed and how long it took (:meth:`observe_forward`). Three optional hooks
are called when a policy defines them: ``observe_load(waiting, max_batch)`` before decide
(requests queued beyond the step's batch, and the batch limit), and after each step
``observe_overhead(seconds, shape)`` (its time outside the forwards, and a :class:`StepShape`
saying what the step did: requests, drafting requests, draft tokens, draft forwards; a hook
that takes only ``seconds`` is called with that alone) and ``observe_step(tokens, seconds,
waiting)`` (the tokens it emitted for all requests, its whole time and the requests left
waiting for admission). A policy with
a true ``wants_node_probs`` attribute gets, in each StepRequest's ``node_probs``, the
model-free proposers' candidate trees for the step as node probabilities, and is told after
each such verification what they predicted (``observe_tree(request, method, predicted,
accepted)``, when defined). With draft-model trees (draft_tree_width > 1) a policy's
``size_trees(requests, path_probs, parents, max_nodes, other_tokens)``, when defined, picks
each grown tree's nodes to verify (engine/draft_tree.py), and ``observe`` hears the draft's
greedy chain's part of each tree. k = 0 means plain decoding. The engine caps k by what a request
may still emit and by the context limit.

Built-in policies: ``none``, ``static`` (fixed k), ``switch_off`` (fixed k while the batch is
small, 0 above a threshold) and ``goodput`` (specd.engine.goodput: k per request and step
that maximizes expected goodput from learned acceptance and costs). More can be registered
by other packages under the ``specd.policies`` entry-point group (specd.engine.policies).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence

from specd.engine.request import Request


@dataclass
class StepRequest:
    """A running request as a policy sees it in one step."""

    request: Request
    # tokens the target verifies for it anyway: prefix chunk + root (a waiting request: its
    # tokens past the prefix it would adopt from the prefix cache, StepPlanner.cached_prefix)
    base_tokens: int
    k_max: int                # the largest k it may get (config cap, max_tokens, context)
    draft_catch_up: int = 1   # tokens its first draft-model forward would process (likewise)
    remaining_tokens: int = 1 << 30  # tokens it may still generate (max_tokens, context)
    # policies with wants_node_probs: per model-free method, float32 [candidate nodes] the
    # acceptance probabilities of the nodes it would propose with a budget of k_max (no root)
    node_probs: Optional[dict] = None


@dataclass(frozen=True)
class StepShape:
    """What a step did, as far as its host time depends on it (observe_overhead; the C++
    OverheadModel, overhead_model.h)."""

    requests: int = 0           # requests the step ran (prefill chunks and verifications)
    drafting_requests: int = 0  # of them, requests with k > 0
    draft_tokens: int = 0       # draft tokens verified (chain drafts, tree nodes)
    draft_forwards: int = 0     # draft-model forwards the step ran


def shape_aware(fn: Callable) -> Callable[[float, StepShape], object]:
    """``fn`` as a function of (seconds, shape): itself when it takes a second positional
    argument, else a wrapper that drops the shape (hooks and timers written before step
    shapes: ``observe_overhead(seconds)``, ``step_seconds(forward_seconds)``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the current protocol
        return fn
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params):
        return fn
    return lambda seconds, shape: fn(seconds)


def overhead_hook(policy) -> Optional[Callable[[float, StepShape], None]]:
    """The policy's ``observe_overhead`` as a function of (seconds, shape) (:func:`shape_aware`),
    or None when it has none."""
    hook = getattr(policy, "observe_overhead", None)
    return None if hook is None else shape_aware(hook)


@dataclass
class Decision:
    k: int
    method: str               # the proposer it speculates with (ignored when k == 0)
    predicted_tokens: float = 1.0  # the policy's expectation of tokens this step yields


class SpeculationPolicy(Protocol):
    methods: tuple[str, ...]

    def decide(self, batch: Sequence[StepRequest]) -> list[Decision]:
        """One decision per request of the batch, in order."""

    def observe(self, request: Request, method: str, depth: int, accepted: int) -> None:
        """After verification: the request's proposal reached `depth`, `accepted` drafts passed."""

    def observe_forward(self, model: str, tokens: int, seconds: float) -> None:
        """A forward of `model` ("target" or "draft") processed `tokens` tokens in `seconds`."""

    def forget(self, request: Request) -> None:
        """The request ended."""


class _Fixed:
    """Shared plumbing of the policies that need no feedback."""

    def __init__(self, methods: Sequence[str] = ("none",)):
        self.methods = tuple(methods)

    def observe(self, request: Request, method: str, depth: int, accepted: int) -> None:
        pass

    def observe_forward(self, model: str, tokens: int, seconds: float) -> None:
        pass

    def forget(self, request: Request) -> None:
        pass

    def _decisions(self, batch: Sequence[StepRequest], k: int) -> list[Decision]:
        return [Decision(min(k, s.k_max), self.methods[0]) for s in batch]


class NoSpeculation(_Fixed):
    """Plain decoding: k = 0 always."""

    def decide(self, batch: Sequence[StepRequest]) -> list[Decision]:
        return self._decisions(batch, 0)


class StaticPolicy(_Fixed):
    """The same k for every request and step (with the first configured method)."""

    def __init__(self, k: int, methods: Sequence[str] = ("none",)):
        super().__init__(methods)
        self.k = k

    def decide(self, batch: Sequence[StepRequest]) -> list[Decision]:
        return self._decisions(batch, self.k)


class SwitchOffPolicy(_Fixed):
    """k while at most `max_batch` requests run in the step, 0 above (milestone 1 of the
    controller: speculation off under load)."""

    def __init__(self, k: int, max_batch: int = 4, methods: Sequence[str] = ("none",)):
        super().__init__(methods)
        self.k, self.max_batch = k, max_batch

    def decide(self, batch: Sequence[StepRequest]) -> list[Decision]:
        return self._decisions(batch, self.k if len(batch) <= self.max_batch else 0)
