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
from specd.engine.batch_verify import verify_inputs
from specd.engine.draft_tree import DraftTree, run_draft_tree
from specd.engine.grammar_drafts import DraftGrammar, constrained, forced_tokens, prune_tree, with_forced
from specd.engine.logits_processors import LogitsProcessors
from specd.engine.logprobs import TokenLogprobs
from specd.engine.params import SpeculationConfig
from specd.engine.policy import Decision, SpeculationPolicy, StepRequest, StepShape, overhead_hook, shape_aware
from specd.engine.request import Request
from specd.engine.scheduler import DRAFT, TARGET, Scheduler, SchedulerConfig, WorkItem
from specd.engine.step_logprobs import row_starts, step_logprobs, take_prompt_rows
from specd.engine.timer import EventTimer, WallTimer, causal_keys
from specd.errors import InvalidArgumentError
from specd.models.kernel_choice import kernels_of
from specd.kv_cache import KVCachePool
from specd.models.llama import LlamaModel
from specd.verification import TokenTree, VerifyOutput


@dataclass
class EngineTimings:
    """Time spent in the engine (seconds, wall or synthetic), split by phase, since the last reset."""

    steps: int = 0
    step_s: float = 0.0            # whole steps
    target_forward_s: float = 0.0  # target model forwards (verify / prefill)
    draft_forward_s: float = 0.0   # draft model forwards
    draft_forwards: int = 0        # draft model forward passes

    @property
    def other_s(self) -> float:
        """Everything that is not a model forward: scheduling, proposing, verification, I/O."""
        return max(0.0, self.step_s - self.target_forward_s - self.draft_forward_s)

    def reset(self) -> None:
        self.__init__()


class Engine:
    def __init__(self, target: LlamaModel, draft: Optional[LlamaModel], pool: KVCachePool,
                 speculation: SpeculationConfig, policy: SpeculationPolicy, scheduler_config: SchedulerConfig,
                 timer=None):
        self.target, self.draft, self.pool = target, draft, pool
        self.speculation, self.policy = speculation, policy
        self._observe_overhead = overhead_hook(policy)  # (seconds, StepShape), or None
        self.scheduler = Scheduler(pool, scheduler_config, policy)
        self.proposers = self._make_proposers(speculation)
        if self.proposers and getattr(policy, "wants_node_probs", False):
            self.scheduler.probe = self._probe_trees
        self._tree_probs: dict[int, float] = {}  # request id -> its proposed drafts' node_probs summed
        self._draft_trees: dict[int, DraftTree] = {}  # request id -> this step's draft-model tree
        self.processors = LogitsProcessors()  # SamplingParams' min_tokens, logit_bias, penalties
        # On a GPU, forwards are timed by CUDA events (no host synchronisation around them).
        self.timer = timer or (EventTimer(target.device) if target.device.type == "cuda" else WallTimer())
        self._step_seconds = shape_aware(self.timer.step_seconds)  # (forward seconds, StepShape)
        self.draft_graph = None  # a DraftGraphRunner for the draft loop (LLM's draft_graph)
        self.target_graph = None  # a TargetGraphRunner for verify steps (LLM's target_graph)
        # Draft-model chains stay on the device from the draft graph runner into the target
        # graph runner's inputs when both runners take the step (model_runner.DeviceDrafts):
        # the host reads them after queueing the verify forward. False: read them between.
        self.device_drafts = True
        # Sampled requests are verified from the target's logits (verify_stochastic_logits:
        # only the rows of visited nodes are planned, none is written). False: every node's
        # probability row is written by sampling_probs first (the same results).
        self.verify_from_logits = True
        # Requests with structured outputs (grammar_drafts.py): model-free trees led by the
        # grammar's forced tokens and pruned to what it allows, draft-model rows masked by it.
        # False: all off (the same outputs). forced_drafts = False: no forced tokens (the rest on).
        self.constrain_drafts = True
        self.forced_drafts = True
        # Jump-forward (SchedulerConfig.jump_forward_tokens > 0): a constrained request the
        # policy gives no drafts verifies its grammar's forced tokens instead (_jump_forward).
        self._forced: dict[int, list[int]] = {}  # request id -> this step's forced chain
        if scheduler_config.jump_forward_tokens > 0:
            self.scheduler.jump_forward = self._jump_forward
        self._forward_s = {"draft": 0.0, "target": 0.0}  # this step's forward seconds
        self._pending_forwards: list[tuple] = []  # (model, tokens, span) of timers that defer
        self.steps = 0
        self._held: list[tuple[Request, Request]] = []  # (request, the request it follows): add(follows=...)
        # Ids of online requests (Request.online) that steps scheduled or that ended (aborts)
        # since the consumer last emptied it: LLM.step reports only those.
        self.touched: set[int] = set()
        self._emitted = 0  # tokens emitted in the current step (observe_step)
        self.timings = EngineTimings()
        self.telemetry = {"k": [], "accepted": 0, "drafted": 0, "predicted": 0.0, "realised": 0,
                          "proposed_per_depth": [], "accepted_per_depth": [], "methods": {}}

    @staticmethod
    def _make_proposers(s: SpeculationConfig) -> dict:
        proposers = {}
        if "ngram" in s.methods:
            proposers["ngram"] = _core.NgramProposer(n_min=s.ngram_min, n_max=s.ngram_max,
                                                     max_candidates=s.ngram_candidates,
                                                     max_scan=max(32, s.ngram_candidates))
        if "suffix" in s.methods:
            proposers["suffix"] = _core.SuffixProposer()
        return proposers

    # ---- requests ----

    def add(self, request: Request, follows: Optional[Request] = None) -> None:
        """Queues a request. ``follows``: a request with the same prompt (another completion of
        it) whose KV this one may adopt: with prefix caching this one is held back until that
        one has computed all of the prompt but its last token (or has ended), then queued, so
        it adopts the prompt's cached blocks instead of prefilling them again (not when the
        prompt has no whole block to share: it would only wait)."""
        for p in self.proposers.values():
            p.add_request(request.id, request.prompt_ids)
        if (follows is not None and self.scheduler.prefix_caching and not request.wants_prompt_rows
                and len(request.prompt_ids) - 1 >= self.pool.block_size(TARGET)
                and follows.prompt_ids == request.prompt_ids):
            self._held.append((request, follows))
            return
        self.scheduler.add(request)

    def _release_held(self) -> None:
        """Queues the held requests whose leader has computed its prompt (or has ended)."""
        keep = []
        for req, leader in self._held:
            if leader.finished or leader.computed[TARGET] >= len(leader.prompt_ids) - 1:
                self.scheduler.add(req)
            else:
                keep.append((req, leader))
        self._held = keep

    def abort(self, request: Request) -> None:
        self._held = [(r, leader) for r, leader in self._held if r is not request]
        self._release(request, finished=False)
        request.finish("abort")
        if request.online:
            self.touched.add(request.id)

    def _release(self, request: Request, finished: bool) -> None:
        self.scheduler.finish(request)
        self.policy.forget(request)
        self._tree_probs.pop(request.id, None)
        self.processors.release(request.id)
        for p in self.proposers.values():
            if request.id in p:
                p.remove_request(request.id, finished=finished)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or bool(self._held)

    # ---- one step ----

    def step(self) -> list[Request]:
        self.timer.step_begin()
        if self._held:
            self._release_held()
        items = self.scheduler.schedule()
        if not items:
            if self.scheduler.waiting and not self.scheduler.running:
                req = self.scheduler.waiting[0]
                raise InvalidArgumentError(f"request {req.id} ({req.length} tokens) cannot be scheduled: the KV "
                                           f"pool ({self.pool.blocks.num_pages} pages) is too small for it")
            return []
        now = time.perf_counter()
        for it in items:
            if it.request.started is None:
                it.request.started = now
        self.touched.update(it.request.id for it in items if it.request.online)
        deciding = [it for it in items if it.decide]
        self._forward_s = {"draft": 0.0, "target": 0.0}
        self._pending_forwards.clear()  # (a step that raised may have left some)
        draft_forwards = self.timings.draft_forwards
        trees, draft_dists, drafts = self._propose(deciding, sum(it.num_prefix for it in items))
        if drafts is not None and not model_runner.graph_takes(self.target_graph, self.target, self.pool, items,
                                                               trees):
            self._place_drafts(drafts, trees)
            drafts = None
        tokens = sum(it.num_prefix + (len(trees[it.request.id]) if it.decide else 0) for it in items)
        # Attended keys price a synthetic step (timer.py); a wall clock does not read them.
        keys = sum(_target_keys(it, trees) for it in items) if getattr(self.timer, "synthetic", True) else None
        logits = self._timed_forward("target", tokens, lambda: model_runner.run_target(
            self.target, self.pool, items, trees, graph=self.target_graph, drafts=drafts), keys)
        logits = take_prompt_rows(items, trees, logits)
        finished = []
        self._emitted = 0
        target_kernels = kernels_of(self.target)
        starts = row_starts(deciding, trees)
        raw = logits  # what logprobs read: the rows before the logits processors
        processed = [it for it in deciding if it.request.params.processed]
        processing_errors: dict[int, str] = {}
        if processed:
            if any(it.request.params.logprobs is not None for it in deciding):
                raw = logits.clone()
            self.processors.apply(logits, [it.request for it in processed], [trees[it.request.id] for it in processed],
                                  [starts[it.request.id] for it in processed], processing_errors)
        # Verification queues its device work behind the verify forward, then reads everything,
        # device-resident drafts included, in one copy: the step's one wait for the GPU.
        inputs = verify_inputs(deciding, trees, logits, draft_dists, cluster=target_kernels.cluster_rows,
                               gumbel=target_kernels.draw == "gumbel", drafts=drafts,
                               from_logits=self.verify_from_logits)
        if drafts is not None:  # (already read with the verification results)
            self._place_drafts(drafts, trees)
        for rid, message in processing_errors.items():  # fails that request alone, below
            inputs[rid].error = message
        # Every request's accepted path first, then the KV moves they need, one kv_compact per
        # model for the whole step, before the commits (which free the reserved pages).
        results = {it.request.id: inputs[it.request.id].verify(trees[it.request.id])
                   for it in deciding if inputs[it.request.id].error is None}
        fed = self._compact_paths(deciding, trees, results)
        logprobs = step_logprobs(deciding, starts, results, raw)
        for it in items:
            if not it.decide:
                self._commit_prefill(it)
                continue
            failed = inputs[it.request.id].error
            if failed is not None:  # this request alone ends; its KV and reservations are freed
                self._draft_trees.pop(it.request.id, None)
                self._release(it.request, finished=False)
                it.request.fail(failed)
                finished.append(it.request)
            elif self._accept(it, trees[it.request.id], results[it.request.id], fed.get(it.request.id),
                              logprobs.get(it.request.id)):
                finished.append(it.request)
        shape = StepShape(len(items), sum(1 for it in deciding if it.k > 0),
                          sum(trees[it.request.id].num_drafts for it in deciding),
                          self.timings.draft_forwards - draft_forwards)
        draft_s, target_s = self._settle_forwards()
        forward_s = draft_s + target_s
        step_s = self._step_seconds(forward_s, shape)
        if self._observe_overhead is not None:
            self._observe_overhead(step_s - forward_s, shape)
        observe_step = getattr(self.policy, "observe_step", None)
        if observe_step is not None:
            observe_step(self._emitted, step_s, self.scheduler.num_waiting)
        self.steps += 1
        t = self.timings
        t.steps += 1
        t.step_s += step_s
        t.target_forward_s += target_s
        t.draft_forward_s += draft_s
        return finished

    def _timed_forward(self, model: str, tokens: int, fn, keys: Optional[int] = None):
        """Runs a forward through the timer and reports its time to the policy: at once, or at
        the end of the step for a timer that defers (EventTimer's spans). Returns fn's result."""
        result, seconds = self.timer.forward(model, tokens, fn, keys)
        if hasattr(seconds, "resolve"):
            self._pending_forwards.append((model, tokens, seconds))
        else:
            self._observe_forward(model, tokens, seconds)
        return result

    def _observe_forward(self, model: str, tokens: int, seconds: float) -> None:
        self.policy.observe_forward(model, tokens, seconds)
        self._forward_s[model] += seconds

    def _settle_forwards(self) -> tuple[float, float]:
        """The step's deferred forward times reported; returns its (draft, target) seconds."""
        for model, tokens, span in self._pending_forwards:
            self._observe_forward(model, tokens, span.resolve())
        self._pending_forwards.clear()
        return self._forward_s["draft"], self._forward_s["target"]

    @staticmethod
    def _place_drafts(drafts: model_runner.DeviceDrafts, trees: dict[int, TokenTree]) -> None:
        """The device-resident chains, read to the host, into their items' trees."""
        for it, chain in zip(drafts.items, drafts.to_host()):
            trees[it.request.id] = TokenTree.chain(it.request.tokens[-1], chain)

    def _probe_trees(self, batch: list[StepRequest]) -> None:
        """StepRequest.node_probs: each model-free proposer's candidate tree at a budget of
        k_max nodes (its drafts' node probabilities; the root's is left out)."""
        asked = [s for s in batch if s.k_max > 0]
        for method, proposer in self.proposers.items():
            group = [s for s in asked if s.request.id in proposer]
            if not group:
                continue
            budget = [s.k_max for s in group]
            out = proposer.propose([s.request.id for s in group], budget, budget)
            offsets, probs = out.offsets, out.node_probs
            for i, s in enumerate(group):
                if s.node_probs is None:
                    s.node_probs = {}
                # a constrained request: its tree as _propose_free makes it (forced drafts certain)
                shaped = (self._constrained_tree(s.request, out.tree(i), s.k_max, s.k_max)
                          if constrained(s.request) else None)
                s.node_probs[method] = (probs[offsets[i] + 1:offsets[i + 1]] if shaped is None
                                        else _source_probs(probs, offsets[i], shaped[1]))

    def _tree_sizer(self, items: list[WorkItem], group: list[WorkItem], prefix_tokens: int):
        """The policy's size_trees for the draft trees of ``group`` (None: the policy has none),
        with the tokens the target verifies anyway: prefix chunks, and every other deciding
        item's root and reserved nodes."""
        size_trees = getattr(self.policy, "size_trees", None)
        if size_trees is None:
            return None
        ids = {it.request.id for it in group}
        other = prefix_tokens + sum(1 + it.nodes for it in items if it.request.id not in ids)
        return lambda grp, probs, parents: size_trees([it.request for it in grp], probs, parents,
                                                       [it.nodes for it in grp], other)

    def _propose(self, items: list[WorkItem], prefix_tokens: int = 0,
                 ) -> tuple[dict[int, TokenTree], dict[int, torch.Tensor], Optional[model_runner.DeviceDrafts]]:
        """Every deciding item's tree and, for sampled draft-model chains, the draft
        distributions. Third: the draft model's chains when they stayed on the device (their
        trees hold placeholder tokens until ``_place_drafts``), else None."""
        trees = {it.request.id: TokenTree(it.request.tokens[-1]) for it in items}
        dists: dict[int, torch.Tensor] = {}
        on_device = None
        by_method: dict[str, list[WorkItem]] = {}
        for it in items:
            if it.k > 0:
                by_method.setdefault(it.method, []).append(it)
        for method, group in by_method.items():
            if method == "draft":
                grammar = (DraftGrammar(self.processors.grammars, forced=self.forced_drafts)
                           if self.constrain_drafts and any(constrained(it.request) for it in group) else None)
                try:
                    on_device = self._propose_draft(items, group, trees, dists, prefix_tokens,
                                                    alone=len(by_method) == 1, grammar=grammar)
                finally:
                    if grammar is not None:
                        grammar.close()
            elif method == "forced":  # _jump_forward's chains
                for it in group:
                    forced = self._forced[it.request.id][:min(it.k, it.nodes)]
                    trees[it.request.id] = TokenTree.chain(it.request.tokens[-1], forced)
            else:
                self._propose_free(method, group, trees)
        return trees, dists, on_device

    def _jump_forward(self, batch: list[StepRequest], decisions: dict[int, Decision]) -> None:
        """Jump-forward decoding as speculation (the scheduler's hook, after the policy
        decided): a constrained request the policy gives no drafts (k = 0, also with no
        speculation configured) whose grammar forces a continuation from its output verifies
        those forced tokens as a chain this step (method "forced", at most
        jump_forward_tokens and room - 1 tokens). Verification keeps it lossless: a forced
        token is accepted where the target's masked row picks it (certainly where the
        vocabulary spells the forced text one way only). The policy does not hear of these
        chains (they are not its proposers' drafts). Off with constrain_drafts or
        forced_drafts off."""
        self._forced.clear()
        if not (self.constrain_drafts and self.forced_drafts):
            return
        limit = self.scheduler.config.jump_forward_tokens
        for s in batch:
            req = s.request
            if decisions[req.id].k > 0 or not constrained(req) or s.remaining_tokens < 2:
                continue
            matcher = self.processors.grammars.matcher(req)
            forced = forced_tokens(matcher, min(limit, s.remaining_tokens - 1)) if matcher is not None else []
            if forced:
                self._forced[req.id] = forced
                decisions[req.id] = Decision(len(forced), "forced", 1.0 + len(forced))

    def _propose_draft(self, items: list[WorkItem], group: list[WorkItem], trees: dict[int, TokenTree],
                       dists: dict[int, torch.Tensor], prefix_tokens: int, alone: bool,
                       grammar: Optional[DraftGrammar]) -> Optional[model_runner.DeviceDrafts]:
        """The draft model's trees (or chains, and their distributions) for ``group``, into
        ``trees`` / ``dists``; returns the chains when they stayed on the device (``alone``:
        no other proposer has items in the step)."""
        def on_forward(tokens: int, fn, keys: Optional[int] = None):
            self.timings.draft_forwards += 1
            return self._timed_forward("draft", tokens, fn, keys)
        width = self.scheduler.config.draft_tree_width
        if width > 1:  # deterministic top-w candidates: verified one-hot (no draft rows)
            sizer = self._tree_sizer(items, group, prefix_tokens)
            for it, drafted in zip(group, run_draft_tree(self.draft, self.pool, group, width, on_forward,
                                                         sizer, graph=self.draft_graph, grammar=grammar)):
                trees[it.request.id] = drafted.tree
                self._draft_trees[it.request.id] = drafted
                if sizer is not None and drafted.tree.num_drafts:  # the policy learns its calibration
                    self._tree_probs[it.request.id] = drafted.predicted
            return None
        # Only draft-model chains in the step: they may stay on the device until the target
        # graph runner has queued the verify forward (the target's inputs then have no
        # host-known draft tokens to mix with theirs).
        # (Penalties and grammars need the drafts on the host before verification: logits_processors.py.)
        on_device = None
        kept = (model_runner.run_draft_on_device(self.draft, self.pool, group, on_forward, self.draft_graph)
                if self.device_drafts and alone and self.target_graph is not None
                and not any(it.request.params.needs_host_drafts for it in group) else None)
        if kept is not None:
            on_device, qs = kept
            drafts = [[0] * it.k for it in group]  # placeholders (_place_drafts)
        else:
            drafts, qs = model_runner.run_draft(self.draft, self.pool, group, on_forward, graph=self.draft_graph,
                                                grammar=grammar)
        for it, d, q in zip(group, drafts, qs):
            trees[it.request.id] = TokenTree.chain(it.request.tokens[-1], d)
            if q is not None:  # rows of the k nodes with children (the leaf has none)
                dists[it.request.id] = q
        return on_device

    def _propose_free(self, method: str, group: list[WorkItem], trees: dict[int, TokenTree]) -> None:
        """A model-free proposer's trees for ``group``, into ``trees``; a constrained request's
        reshaped by its grammar (_constrained_tree)."""
        out = self.proposers[method].propose([it.request.id for it in group], [it.k for it in group],
                                             [it.nodes for it in group])
        for i, it in enumerate(group):
            tree = out.tree(i)
            shaped = self._constrained_tree(it.request, tree, it.k, it.nodes)
            trees[it.request.id] = tree if shaped is None else shaped[0]
            if self.scheduler.probe is not None:  # a policy that learns from node probabilities
                self._tree_probs[it.request.id] = (out.expected_accepted(i) if shaped is None else
                                                   float(_source_probs(out.node_probs, out.offsets[i],
                                                                       shaped[1]).sum()))

    def _constrained_tree(self, request: Request, tree: TokenTree, k: int,
                          nodes: int) -> Optional[tuple[TokenTree, np.ndarray]]:
        """A constrained request's model-free tree (grammar_drafts.py): the grammar's forced
        continuation (at most k tokens) as its first branch, then the proposer's nodes the
        grammar allows, at most ``nodes`` drafts; and per node its index in ``tree`` (-1: a
        forced token). None: not constrained, or nothing to change."""
        if not (self.constrain_drafts and constrained(request)):
            return None
        matcher = self.processors.grammars.matcher(request)
        if matcher is None:
            return None
        forced = forced_tokens(matcher, min(k, nodes)) if self.forced_drafts else []
        pruned = prune_tree(matcher, tree) if tree.num_drafts else None
        if not forced:
            return pruned
        base, kept = pruned if pruned is not None else (tree, np.arange(len(tree), dtype=np.int64))
        merged, source = with_forced(base, forced, nodes)
        return merged, np.where(source >= 0, kept[np.maximum(source, 0)], -1)

    def _commit_prefill(self, it: WorkItem) -> None:
        req = it.request
        self.pool.blocks.commit(req.id, it.num_prefix, model=TARGET)
        req.computed[TARGET] += it.num_prefix

    def _compact_paths(self, deciding: list[WorkItem], trees: dict[int, TokenTree],
                       results: dict[int, VerifyOutput]) -> dict[int, np.ndarray]:
        """Moves the step's accepted tree paths into place, in every layer, with one
        ``KVCachePool.compact`` per model (kv_compact over all requests and layers):
        - target: a tree's accepted nodes, written at its root's position + node index, go to
          the positions right after the root (a chain's already are);
        - draft (draft-model trees): the accepted path's fed nodes, written after the catch-up
          in feeding order, go to the positions right after the catch-up.
        Returns each draft tree's fed path (DraftTree.fed_path: what its commit keeps)."""
        target: tuple[list, list, list] = ([], [], [])  # sequences, tree starts, paths
        draft: tuple[list, list, list] = ([], [], [])
        fed_paths = {}
        for it in deciding:
            req = it.request
            out = results.get(req.id)
            if out is None:
                continue
            accepted = out.num_accepted
            path = out.path[:accepted + 1]
            if accepted and not trees[req.id].is_chain and not np.array_equal(path, np.arange(accepted + 1)):
                for column, value in zip(target, (req.id, req.computed[TARGET] + it.num_prefix, path)):
                    column.append(value)
            drafted = self._draft_trees.get(req.id) if it.draft_slots is not None else None
            if drafted is not None:
                fed = fed_paths[req.id] = drafted.fed_path(out.path)
                if not np.array_equal(fed, np.arange(len(fed))):
                    # fed node f at catch-up end + f: as a path from a root one position before
                    start = req.computed[DRAFT] + it.draft_catch_up - 1
                    for column, value in zip(draft, (req.id, start, np.concatenate([[0], fed + 1]))):
                        column.append(value)
        self.pool.compact(TARGET, *target)
        self.pool.compact(DRAFT, *draft)
        return fed_paths

    def _accept(self, it: WorkItem, tree: TokenTree, out: VerifyOutput, fed: Optional[np.ndarray] = None,
                logprobs: Optional[list[TokenLogprobs]] = None) -> bool:
        """Commits one request's verified step (its path's KV already moved into place by
        _compact_paths; ``fed``: its draft tree's fed path), emits its tokens (with their
        ``logprobs`` when it asked for them). True if it finished."""
        req = it.request
        accepted = out.num_accepted
        # Target KV: commit the prefix, the root and the accepted drafts; rejected slots are
        # dropped by the commit.
        base = it.num_prefix
        self.pool.blocks.commit(req.id, base + 1 + accepted, model=TARGET)
        req.computed[TARGET] += base + 1 + accepted
        if it.draft_slots is not None:  # the draft wrote KV for its catch-up and its fed drafts
            # The catch-up's KV and the accepted drafts' the draft wrote (a chain: drafts
            # 1..k-1, in place; a tree: the accepted path's fed nodes, moved next to the
            # catch-up) become its history; the rest is dropped by the commit.
            kept = min(accepted, it.k - 1) if fed is None else len(fed)
            keep = it.draft_catch_up + kept
            self.pool.blocks.commit(req.id, keep, model=DRAFT)
            req.computed[DRAFT] += keep
        self._record(it, tree, accepted, out.path)
        # Tokens: accepted drafts then the bonus token, cut at a stop condition.
        tokens = out.tokens.tolist()
        kept = req.emit(tokens, accepted, logprobs)
        self._emitted += kept
        for p in self.proposers.values():
            p.append(req.id, tokens[:kept])
        if req.finished:
            self._release(req, finished=True)
            return True
        return False

    def _record(self, it: WorkItem, tree: TokenTree, accepted: int, path: np.ndarray) -> None:
        """Metrics, telemetry and the policy's feedback for one verify step."""
        req, m = it.request, it.request.metrics
        drafts = tree.num_drafts
        m.verify_steps += 1
        m.draft_tokens += drafts
        m.accepted_tokens += accepted
        m.k_per_step.append(it.k)
        m.methods_per_step.append(it.method)
        m.predicted_tokens.append(it.predicted_tokens)
        m.realised_tokens.append(accepted + 1)
        tel = self.telemetry
        tel["k"].append(it.k)
        tel["drafted"] += drafts
        tel["accepted"] += accepted
        tel["predicted"] += it.predicted_tokens
        tel["realised"] += accepted + 1
        if it.k > 0:
            _count_depths(m.accepted_per_position, accepted)
            tel["methods"][it.method] = tel["methods"].get(it.method, 0) + 1
            _count_depths(tel["proposed_per_depth"], tree.max_depth)
            _count_depths(tel["accepted_per_depth"], accepted)
            drafted = self._draft_trees.pop(req.id, None)
            # A draft-model tree reports its greedy chain's part (draft_tree.py).
            depth, passed = drafted.chain_result(path) if drafted is not None else (tree.max_depth, accepted)
            if it.method != "forced":  # (jump-forward chains are not the policy's: _jump_forward)
                self.policy.observe(req, it.method, depth, passed)
            predicted = self._tree_probs.pop(req.id, None)
            observe_tree = getattr(self.policy, "observe_tree", None)
            if predicted is not None and observe_tree is not None:
                observe_tree(req, it.method, predicted, accepted)

    def metrics(self) -> dict:
        """Engine-wide telemetry: steps; per verified request-step the k chosen (mean, histogram,
        share speculating, proposer counts); acceptance overall and per depth (accepted /
        proposed at depth d); the policy's predicted vs the realised generated tokens; under
        "policy", what the policy's own ``metrics()`` returns, when it defines one."""
        tel = self.telemetry
        ks = tel["k"]
        acc = tel["accepted_per_depth"]
        per_depth = [(acc[d] if d < len(acc) else 0) / p for d, p in enumerate(tel["proposed_per_depth"])]
        out = {"steps": self.steps, "verify_request_steps": len(ks), "mean_k": float(np.mean(ks)) if ks else 0.0,
               "k_histogram": {int(k): int(n) for k, n in zip(*np.unique(ks, return_counts=True))} if ks else {},
               "speculating_share": float(np.mean([k > 0 for k in ks])) if ks else 0.0,
               "methods": dict(tel["methods"]),
               "acceptance_rate": tel["accepted"] / tel["drafted"] if tel["drafted"] else 0.0,
               "acceptance_per_depth": per_depth,
               "predicted_tokens": tel["predicted"], "realised_tokens": tel["realised"]}
        policy_metrics = getattr(self.policy, "metrics", None)
        if policy_metrics is not None:
            out["policy"] = policy_metrics()
        return out

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


def _source_probs(node_probs: np.ndarray, offset: int, source: np.ndarray) -> np.ndarray:
    """The drafts' node probabilities of a reshaped proposal (Engine._constrained_tree's
    ``source``: each node's index in the proposal at ``offset``, -1 for a forced token: 1)."""
    drafts = source[1:]
    return np.where(drafts >= 0, node_probs[offset + np.maximum(drafts, 0)], 1.0).astype(np.float32)


def _count_depths(counts: list[int], n: int) -> None:
    """Adds one to each of depths 1..n (``counts[d - 1]``), growing the list as needed."""
    if len(counts) < n:
        counts.extend([0] * (n - len(counts)))
    for d in range(n):
        counts[d] += 1


def _target_keys(item: WorkItem, trees: dict[int, TokenTree]) -> int:
    """Keys the target forward's new tokens of ``item`` attend (timer.causal_keys): its prefix
    chunk from the committed length, then its tree from the last token's position."""
    req = item.request
    keys = causal_keys(req.computed[TARGET], item.num_prefix)
    if item.decide:
        keys += causal_keys(req.length - 1, len(trees[req.id]))
    return keys

