"""Continuous-batching scheduler: which requests run this step, with how many new tokens
and draft nodes, and the KV slots they write (reserved in the shared page pool).

The decisions are the C++ StepPlanner's (cpp/include/specd/step_planner.h, which has the
rules: planning order, chunked prefill, the node budget of a proposal, admission with a
page of headroom per running request, reservations for target and draft, preemption of the
newest request when the pool is out of pages), so a C++ server embedding specd schedules
exactly as this engine does. This class adapts it to the engine's Request objects:
- before each plan it tells the planner every request's length, committed KV and room;
- it asks the policy once per step for the running batch and the waiting requests that may
  be admitted (a policy with observe_load also hears how many more are queued and the batch
  limit), with k capped so that the step cannot emit past max_tokens or the context limit;
- it applies the plan: copy-on-write page copies, WorkItems, and the Request state of
  preempted (KV freed, recomputed later from their tokens) and admitted requests.

With prefix caching (the pool's BlockManager has it on), the planner also keeps each
request's tokens (sent with each sync: the ones since the previous sync), registers the full
blocks of committed KV, and on admission a request adopts the longest cached prefix of its
tokens (target and draft): its item says how many tokens (``cached_target`` /
``cached_draft``), which become its computed KV. A request that wants its prompt's logprobs
opts out (it needs the prefill's logits of every prompt token).

A running request's KV covers tokens ``[0, computed)`` (target model 0; draft model 1). Its
last token never has KV before a step: a step feeds ``tokens[computed : L-1]`` (prefill,
chunked by the token budget) and, once that prefix is complete, the root (the last token)
plus up to ``nodes`` draft nodes, verified in the same forward. So the first verify of a
request is fused with the end of its prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from specd import _core
from specd.engine.policy import Decision, SpeculationPolicy, StepRequest
from specd.engine.request import Request, Status
from specd.kv_cache import KVCachePool

TARGET, DRAFT = 0, 1


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 1024  # new tokens per step (prefill chunks + verify tokens)
    uses_draft_kv: bool = False          # a draft model runs (model 1 in the pool)
    k_max: int = 0                       # the largest k of the speculation config
    model_free_tree_nodes: int = -1      # node budget of a depth-k > 0 ngram/suffix tree (-1: k)
    draft_tree_width: int = 1            # > 1: the draft model grows trees (SpeculationConfig)
    draft_tree_nodes: int = -1           # node budget of a depth-k > 0 draft tree (-1: k * width)
    jump_forward_tokens: int = 0         # the longest forced chain of a "forced" decision (jump_forward)


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


# StepPlanner's ProposalKind of each method ("forced": the grammar's forced tokens, jump_forward)
_KINDS = {"ngram": 1, "suffix": 1, "forced": 1, "draft": 2}


class Scheduler:
    def __init__(self, pool: KVCachePool, config: SchedulerConfig, policy: SpeculationPolicy):
        self.pool, self.blocks, self.config, self.policy = pool, pool.blocks, config, policy
        self.planner = _core.StepPlanner(
            pool.blocks, config.max_num_seqs, config.max_num_batched_tokens, config.uses_draft_kv,
            max(config.k_max, config.jump_forward_tokens),
            model_free_tree_nodes=config.model_free_tree_nodes, draft_tree_width=config.draft_tree_width,
            draft_tree_nodes=config.draft_tree_nodes)
        self.requests: dict[int, Request] = {}
        self._unsynced: list[int] = []  # added since the last sync (the planner has no state for them)
        self.prefix_caching = bool(pool.blocks.prefix_caching)
        self._sent: dict[int, int] = {}  # prefix caching: tokens of each request the planner holds
        # Fills StepRequest.node_probs before decide (the engine sets it for policies that
        # want node probabilities; None: not asked).
        self.probe: Optional[Callable[[list[StepRequest]], None]] = None
        # Revises the policy's decisions before planning (the engine's jump-forward: a
        # constrained request given no drafts gets its grammar's forced tokens; None: none).
        self.jump_forward: Optional[Callable[[list[StepRequest], dict[int, Decision]], None]] = None

    @property
    def running(self) -> list[Request]:
        return [self.requests[i] for i in self.planner.running]

    @property
    def waiting(self) -> list[Request]:
        return [self.requests[i] for i in self.planner.waiting]

    @property
    def num_waiting(self) -> int:
        return self.planner.num_waiting

    @property
    def has_work(self) -> bool:
        return self.planner.has_work

    def add(self, request: Request) -> None:
        self.planner.add(request.id, use_prefix_cache=not request.wants_prompt_rows)
        self.requests[request.id] = request
        self._unsynced.append(request.id)
        if self.prefix_caching:
            self._sent[request.id] = 0

    def _new_tokens(self, req: Request) -> list[int]:
        """The request's tokens the planner does not hold yet (prefix caching)."""
        sent, self._sent[req.id] = self._sent[req.id], req.length
        return req.tokens[sent:]

    @property
    def prefix_stats(self) -> dict:
        """The planner's admissions that looked up the prefix cache, their tokens and the
        tokens found, and the pool's cache figures (empty without prefix caching)."""
        if not self.prefix_caching:
            return {}
        return {**self.planner.prefix_hit_stats, **self.blocks.prefix_cache_stats}

    def _step_request(self, req: Request, room: int) -> StepRequest:
        # From the planner's synced state: a waiting request's work is net of its cached prefix.
        base_tokens, draft_catch_up = self.planner.candidate_work(req.id)
        return StepRequest(req, base_tokens=base_tokens, k_max=max(0, min(self.config.k_max, room - 1)),
                           draft_catch_up=draft_catch_up, remaining_tokens=room)

    def schedule(self) -> list[WorkItem]:
        # The planner keeps each request's last synced state. Running requests change every
        # step and new ones have none yet; a waiting request does not change while it waits
        # (a preemption resets its KV on both sides), so a queue costs nothing per step.
        reqs = [self.requests[i] for i in self.planner.running]
        reqs += [self.requests[i] for i in self._unsynced if i in self.requests]
        self._unsynced.clear()
        rooms = {r.id: r.room() for r in reqs}
        self.planner.sync(list(rooms), [r.length for r in reqs], [r.computed[TARGET] for r in reqs],
                          [r.computed[DRAFT] for r in reqs], list(rooms.values()),
                          [self._new_tokens(r) for r in reqs] if self.prefix_caching else [])
        # One decision per step for the running batch and the waiting requests it may admit.
        candidates = self.planner.candidates()
        observe_load = getattr(self.policy, "observe_load", None)
        if observe_load is not None:
            admissible = len(candidates) - len(self.planner.running)
            observe_load(self.planner.num_waiting - admissible, self.config.max_num_seqs)
        batch = [self._step_request(self.requests[i], rooms[i] if i in rooms else self.requests[i].room())
                 for i in candidates]
        if self.probe is not None:
            self.probe(batch)
        decisions = dict(zip(candidates, self.policy.decide(batch)))
        # The planner's cap makes room for jump-forward chains; a policy's k stays within k_max.
        for rid, d in decisions.items():
            if d.k > self.config.k_max:
                decisions[rid] = Decision(self.config.k_max, d.method, d.predicted_tokens)
        if self.jump_forward is not None:
            self.jump_forward(batch, decisions)
        ids = list(decisions)
        items, copies, preempted, admitted = self.planner.plan(
            ids, [decisions[i].k for i in ids], [_KINDS.get(decisions[i].method, 0) for i in ids])
        self.pool.apply_copies(copies)
        for i in preempted:
            req = self.requests[i]
            req.in_blocks = False
            req.computed = [0, 0]
            req.metrics.preemptions += 1
            req.status = Status.WAITING
        admitted = set(admitted)
        for i in admitted:
            self.requests[i].in_blocks = True
            self.requests[i].status = Status.RUNNING
        return [self._item(decisions.get(rid), *rest, rid=rid, admitted=rid in admitted) for rid, *rest in items]

    def _item(self, decision: Optional[Decision], num_prefix: int, decide: bool, k: int, nodes: int, fits: bool,
              target_slots: np.ndarray, draft_catch_up: int, draft_slots: Optional[np.ndarray],
              cached_target: int, cached_draft: int, *, rid: int, admitted: bool) -> WorkItem:
        req = self.requests[rid]
        if admitted:  # its KV starts with what it adopted from the prefix cache
            req.computed = [cached_target, cached_draft]
            if req.metrics.verify_steps == 0 and req.metrics.prefilled_tokens == 0:
                req.metrics.cached_tokens = cached_target
        req.metrics.prefilled_tokens += num_prefix
        method = decision.method if decision is not None and k > 0 else "none"
        predicted = decision.predicted_tokens if decision is not None and k > 0 and fits else 1.0
        return WorkItem(req, num_prefix, decide, k, nodes, target_slots, draft_catch_up,
                        draft_slots, method=method, predicted_tokens=predicted)

    def finish(self, request: Request) -> None:
        """Frees a finished (or aborted) request's KV and drops it from the queues."""
        if request.id in self.requests:
            if self.prefix_caching:  # its last full blocks get registered
                self.planner.finish(request.id, self._new_tokens(request))
                del self._sent[request.id]
            else:
                self.planner.finish(request.id)
            del self.requests[request.id]
        request.in_blocks = False
