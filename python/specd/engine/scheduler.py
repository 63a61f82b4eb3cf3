"""Continuous-batching scheduler: which requests run this step, with how many new tokens
and draft nodes, and the KV slots they write (reserved in the shared page pool).

A running request's KV covers tokens ``[0, computed)`` (target model 0; draft model 1). Its
last token never has KV before a step: a step feeds ``tokens[computed : L-1]`` (prefill,
chunked by the token budget) and, once that prefix is complete, the root (the last token)
plus up to ``nodes`` draft nodes, verified in the same forward. So the first verify of a
request is fused with the end of its prefill.

Rules
- Running requests are planned oldest first, then waiting ones are admitted (oldest first)
  while the batch has room (max_num_seqs, the token budget) and the pool can hold their
  first chunk with a page of headroom per running request.
- Reservations (target, and draft when the draft model runs) are made here; if the pool is
  out of pages, the newest running request is preempted (its KV freed, recomputed later
  from its tokens) until the reservation fits. Older requests are never preempted for newer.
- k and the proposer per request come from the policy: one decide() call per step for the
  running batch and the waiting requests that may be admitted (a policy with observe_load
  also hears how many more are queued and the batch limit); k is capped so that the step
  cannot emit past max_tokens or the context limit.
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from specd.engine.policy import Decision, SpeculationPolicy, StepRequest
from specd.engine.request import Request, Status
from specd.errors import OutOfPagesError
from specd.kv_cache import KVCachePool

TARGET, DRAFT = 0, 1


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 1024  # new tokens per step (prefill chunks + verify tokens)
    uses_draft_kv: bool = False          # a draft model runs (model 1 in the pool)
    k_max: int = 0                       # the largest k of the speculation config
    tree_nodes: Callable[[int], int] = lambda k: k  # node budget of a depth-k ngram/suffix tree
    draft_tree_width: int = 1            # > 1: the draft model grows trees (SpeculationConfig)
    draft_tree_nodes: Callable[[int], int] = lambda k: k  # node budget of a depth-k draft proposal


@dataclass
class WorkItem:
    request: Request
    num_prefix: int                # prefix tokens prefilled this step
    decide: bool                   # the prefix is complete: root + drafts verified this step
    k: int                         # draft depth (0: plain decoding)
    nodes: int                     # draft nodes reserved
    target_slots: np.ndarray       # int64 [num_prefix + (1 + nodes if decide)]
    draft_catch_up: int = 0        # draft model: tokens [computed_d, L) it processes first
    draft_slots: Optional[np.ndarray] = None  # int64 [draft_catch_up + (k - 1) * draft tree width]
    method: str = "none"           # the proposer of its drafts this step
    predicted_tokens: float = 1.0  # the policy's expectation of the tokens this step yields

    @property
    def num_tokens(self) -> int:
        return self.num_prefix + (1 + self.nodes if self.decide else 0)


class Scheduler:
    def __init__(self, pool: KVCachePool, config: SchedulerConfig, policy: SpeculationPolicy):
        self.pool, self.blocks, self.config, self.policy = pool, pool.blocks, config, policy
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Fills StepRequest.node_probs before decide (the engine sets it for policies that
        # want node probabilities; None: not asked).
        self.probe: Optional[Callable[[list[StepRequest]], None]] = None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def _step_request(self, req: Request) -> StepRequest:
        return StepRequest(req, base_tokens=req.length - req.computed[TARGET],
                           k_max=max(0, min(self.config.k_max, req.room() - 1)),
                           draft_catch_up=req.length - req.computed[DRAFT], remaining_tokens=req.room())

    def schedule(self) -> list[WorkItem]:
        budget = self.config.max_num_batched_tokens
        items: list[WorkItem] = []
        # One decision per step for the running batch and the waiting requests it may admit.
        candidates = list(islice(self.waiting, max(0, self.config.max_num_seqs - len(self.running))))
        observe_load = getattr(self.policy, "observe_load", None)
        if observe_load is not None:
            observe_load(len(self.waiting) - len(candidates), self.config.max_num_seqs)
        batch = [self._step_request(r) for r in self.running + candidates]
        if self.probe is not None:
            self.probe(batch)
        decisions = dict(zip((s.request.id for s in batch), self.policy.decide(batch)))
        i = 0
        while i < len(self.running):
            req = self.running[i]
            item = self._plan(req, budget, decisions.get(req.id))
            if item is None:
                i += 1
                continue
            if not self._reserve_or_preempt(item):
                continue  # `req` itself was preempted: running[i] is now the next request
            items.append(item)
            budget -= item.num_tokens
            i += 1
        while self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            req = self.waiting[0]
            item = self._plan(req, budget, decisions.get(req.id))
            if item is None or not self._admit(req, item):
                break
            self.waiting.popleft()
            self.running.append(req)
            req.status = Status.RUNNING
            items.append(item)
            budget -= item.num_tokens
        return items

    def finish(self, request: Request) -> None:
        """Frees a finished (or aborted) request's KV and drops it from the queues."""
        if request.in_blocks:
            self.blocks.free_sequence(request.id)
            request.in_blocks = False
        if request in self.running:
            self.running.remove(request)
        if request in self.waiting:
            self.waiting.remove(request)

    # ---- planning ----

    def _plan(self, req: Request, budget: int, decision: Optional[Decision]) -> Optional[WorkItem]:
        if budget <= 0:
            return None
        remaining_prefix = req.length - 1 - req.computed[TARGET]
        k = 0 if decision is None else max(0, min(decision.k, self.config.k_max, req.room() - 1))
        method = decision.method if decision is not None and k > 0 else "none"
        predicted = decision.predicted_tokens if decision is not None and k > 0 else 1.0
        nodes = (self.config.tree_nodes(k) if method in ("ngram", "suffix")
                 else self.config.draft_tree_nodes(k) if method == "draft" else k)
        empty = np.empty(0, np.int64)
        if remaining_prefix + 1 + nodes <= budget:
            return WorkItem(req, remaining_prefix, True, k, nodes, empty, method=method, predicted_tokens=predicted)
        if remaining_prefix > 0:  # a prefill chunk only
            return WorkItem(req, min(remaining_prefix, budget), False, 0, 0, empty)
        nodes = budget - 1  # decode with a smaller tree
        k = min(k, nodes)
        return WorkItem(req, 0, True, k, nodes if k else 0, empty, method=method if k else "none")

    def _reserve(self, item: WorkItem) -> bool:
        req = item.request
        try:
            reservation = self.blocks.reserve(req.id, item.num_tokens, model=TARGET)
        except OutOfPagesError:
            return False
        self.pool.apply_copies(reservation.copies)
        item.target_slots = reservation.slots
        if item.method == "draft" and item.decide and item.k > 0:
            item.draft_catch_up = req.length - req.computed[DRAFT]
            try:
                reservation = self.blocks.reserve(req.id, item.draft_catch_up + self._draft_fed(item.k), model=DRAFT)
            except OutOfPagesError:
                self.blocks.rollback(req.id, req.computed[TARGET], model=TARGET)
                return False
            self.pool.apply_copies(reservation.copies)
            item.draft_slots = reservation.slots
        return True

    def _draft_fed(self, k: int) -> int:
        """Draft KV slots past the catch-up of a depth-k proposal: a chain feeds drafts 1..k-1;
        a tree of width w feeds up to w frontier nodes at each depth 1..k-1."""
        return max(0, k - 1) * self.config.draft_tree_width

    def _reserve_or_preempt(self, item: WorkItem) -> bool:
        while not self._reserve(item):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is item.request:
                return False
        return True

    def _admit(self, req: Request, item: WorkItem) -> bool:
        draft_tokens = item.num_prefix + 1 + self._draft_fed(item.k) if item.method == "draft" else 0
        need = [item.num_tokens] + ([draft_tokens] if self.config.uses_draft_kv else [])
        if not self.blocks.can_admit(need, headroom_pages=len(self.running)):
            return False
        self.blocks.add_sequence(req.id)
        req.in_blocks = True
        if not self._reserve(item):
            self.blocks.free_sequence(req.id)
            req.in_blocks = False
            return False
        return True

    def _preempt(self, req: Request) -> None:
        self.blocks.free_sequence(req.id)
        req.in_blocks = False
        req.computed = [0, 0]
        req.metrics.preemptions += 1
        req.status = Status.WAITING
        self.running.remove(req)
        self.waiting.appendleft(req)
