"""The engine step: plan, propose, verify, accept, commit/rollback, observe (the data flow of
DESIGN.md). One call of :meth:`Engine.step` advances every scheduled request by one target
forward pass; finished requests are returned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from specd import _core
from specd.engine import model_runner
from specd.engine.params import SpeculationConfig
from specd.engine.policy import SpeculationPolicy
from specd.engine.request import Request, Status
from specd.engine.scheduler import DRAFT, TARGET, Scheduler, SchedulerConfig, WorkItem
from specd.errors import InvalidArgumentError
from specd.kv_cache import KVCachePool
from specd.models.llama import LlamaModel
from specd.verification import TokenTree, verify, verify_greedy_tokens


@dataclass
class EngineTimings:
    """Wall time spent in the engine (seconds), split by phase, since the last reset."""

    steps: int = 0
    step_s: float = 0.0            # whole steps
    target_forward_s: float = 0.0  # target model forwards (verify / prefill)
    draft_forward_s: float = 0.0   # draft model loops
    draft_forwards: int = 0        # draft model forward passes (k per speculating step)

    @property
    def other_s(self) -> float:
        """Everything that is not a model forward: scheduling, proposing, verification, I/O."""
        return max(0.0, self.step_s - self.target_forward_s - self.draft_forward_s)

    def reset(self) -> None:
        self.__init__()


class Engine:
    def __init__(self, target: LlamaModel, draft: Optional[LlamaModel], pool: KVCachePool,
                 speculation: SpeculationConfig, policy: SpeculationPolicy, scheduler_config: SchedulerConfig):
        self.target, self.draft, self.pool = target, draft, pool
        self.speculation, self.policy = speculation, policy
        self.scheduler = Scheduler(pool, scheduler_config, policy)
        self.proposer = self._make_proposer(speculation)
        self.steps = 0
        self.timings = EngineTimings()
        self._sync = target.device.type == "cuda"  # time device work, not just its launch

    @staticmethod
    def _make_proposer(s: SpeculationConfig):
        if s.method == "ngram":
            return _core.NgramProposer(n_min=s.ngram_min, n_max=s.ngram_max, max_candidates=s.ngram_candidates,
                                       max_scan=max(32, s.ngram_candidates))
        if s.method == "suffix":
            return _core.SuffixProposer()
        return None

    # ---- requests ----

    def add(self, request: Request) -> None:
        if self.proposer is not None:
            self.proposer.add_request(request.id, request.prompt_ids)
        self.scheduler.add(request)

    def abort(self, request: Request) -> None:
        self._release(request, finished=False)
        request.status = Status.FINISHED
        request.finish_reason = "abort"

    def _release(self, request: Request, finished: bool) -> None:
        self.scheduler.finish(request)
        if self.proposer is not None and request.id in self.proposer:
            self.proposer.remove_request(request.id, finished=finished)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # ---- one step ----

    def step(self) -> list[Request]:
        items = self.scheduler.schedule()
        if not items:
            if self.scheduler.waiting and not self.scheduler.running:
                req = self.scheduler.waiting[0]
                raise InvalidArgumentError(f"request {req.id} ({req.length} tokens) cannot be scheduled: the KV "
                                           f"pool ({self.pool.blocks.num_pages} pages) is too small for it")
            return []
        start = time.perf_counter()
        for it in items:
            if it.request.started is None:
                it.request.started = start
        deciding = [it for it in items if it.decide]
        trees, draft_dists = self._propose(deciding)
        t0 = self._clock()
        logits = model_runner.run_target(self.target, self.pool, items, trees)
        self.timings.target_forward_s += self._clock() - t0
        finished, row = [], 0
        for it in items:
            if not it.decide:
                self._commit_prefill(it)
                continue
            tree = trees[it.request.id]
            rows = logits[row:row + len(tree)]
            row += len(tree)
            if self._accept(it, tree, rows, draft_dists.get(it.request.id)):
                finished.append(it.request)
        self.steps += 1
        self.timings.steps += 1
        self.timings.step_s += time.perf_counter() - start
        return finished

    def _clock(self) -> float:
        if self._sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _propose(self, items: list[WorkItem]) -> tuple[dict[int, TokenTree], dict[int, torch.Tensor]]:
        trees = {it.request.id: TokenTree(it.request.tokens[-1]) for it in items}
        dists: dict[int, torch.Tensor] = {}
        speculating = [it for it in items if it.k > 0]
        if not speculating:
            return trees, dists
        if self.speculation.method == "draft":
            t0 = self._clock()
            drafts, qs = model_runner.run_draft(self.draft, self.pool, speculating)
            self.timings.draft_forward_s += self._clock() - t0
            self.timings.draft_forwards += max(it.k for it in speculating)
            for it, d, q in zip(speculating, drafts, qs):
                trees[it.request.id] = TokenTree.chain(it.request.tokens[-1], d)
                if q is not None:  # rows for the k nodes with children, plus the leaf's (unused)
                    dists[it.request.id] = torch.cat([q, torch.zeros_like(q[:1])])
        else:
            out = self.proposer.propose([it.request.id for it in speculating], [it.k for it in speculating],
                                        [it.nodes for it in speculating])
            for i, it in enumerate(speculating):
                trees[it.request.id] = out.tree(i)
        return trees, dists

    def _commit_prefill(self, it: WorkItem) -> None:
        req = it.request
        self.pool.blocks.commit(req.id, it.num_prefix, model=TARGET)
        req.computed[TARGET] += it.num_prefix

    def _accept(self, it: WorkItem, tree: TokenTree, rows: torch.Tensor, draft_q: Optional[torch.Tensor]) -> bool:
        """Verifies one request's tree, commits its KV, emits its tokens. True if it finished."""
        req = it.request
        if req.params.greedy:
            out = verify_greedy_tokens(rows.argmax(dim=-1), tree)
        else:
            p = req.params
            probs = _core.sampling_probs(rows.cpu().numpy(), float(p.temperature), p.top_k, float(p.top_p),
                                         float(p.min_p))
            out = verify(probs, tree, None if draft_q is None else draft_q.cpu().numpy(), seed=req.rng_seed,
                         request=req.rng_request, step=0, position=req.length)
        accepted = out.num_accepted
        # Target KV: move the accepted path's K/V next to the prefix (trees), then commit the
        # prefix, the root and the accepted drafts; rejected slots are dropped by the commit.
        base = it.num_prefix
        path = out.path[1:]
        if accepted and not np.array_equal(path, np.arange(1, accepted + 1)):
            self.pool.copy_slots(TARGET, torch.from_numpy(it.target_slots[base + path]),
                                 torch.from_numpy(it.target_slots[base + 1:base + 1 + accepted]))
        self.pool.blocks.commit(req.id, base + 1 + accepted, model=TARGET)
        req.computed[TARGET] += base + 1 + accepted
        if it.draft_slots is not None:  # the draft wrote KV for its catch-up and drafts 1..k-1
            keep = it.draft_catch_up + min(accepted, it.k - 1)
            self.pool.blocks.commit(req.id, keep, model=DRAFT)
            req.computed[DRAFT] += keep
        # Metrics and feedback.
        m = req.metrics
        m.verify_steps += 1
        m.draft_tokens += tree.num_drafts
        m.accepted_tokens += accepted
        if len(m.accepted_per_position) < accepted:
            m.accepted_per_position.extend([0] * (accepted - len(m.accepted_per_position)))
        for d in range(accepted):
            m.accepted_per_position[d] += 1
        self.policy.observe(req, tree.num_drafts, accepted)
        # Tokens: accepted drafts then the bonus token, cut at a stop condition.
        tokens = out.tokens.tolist()
        kept = req.emit(tokens, accepted)
        if self.proposer is not None:
            self.proposer.append(req.id, tokens[:kept])
        if req.finished:
            self._release(req, finished=True)
            return True
        return False

    # ---- invariants (tests) ----

    def check_kv(self) -> None:
        """Raises if any running request's KV pages differ from what its committed lengths need."""
        self.pool.blocks.check_invariants()
        for req in self.scheduler.running:
            for model in range(len(self.pool.models)):
                info = self.pool.blocks.info(req.id, model=model)
                need = -(-req.computed[model] // self.pool.block_size(model))
                if info.committed != req.computed[model] or info.reserved != 0 or info.num_pages != need:
                    raise AssertionError(f"request {req.id} model {model}: {info} but computed "
                                         f"{req.computed[model]} needs {need} pages")
