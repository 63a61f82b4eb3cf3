"""The user-facing entry point (vLLM-like):

    llm = specd.LLM(target="path/or/model.gguf", draft="path/or/draft.gguf",
                    speculation=specd.SpeculationConfig(method="draft", num_speculative_tokens=4))
    outs = llm.generate(["def fib(n):"], specd.SamplingParams(temperature=0.0, max_tokens=128))
    for chunk in llm.stream("def fib(n):", params): print(chunk.text, end="")
    rid = llm.add_request("import os", params); chunks = llm.step()   # online serving
"""

from __future__ import annotations

import os
import time
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import torch

from specd.engine.engine import Engine
from specd.engine.outputs import CompletionOutput, RequestOutput, StreamChunk
from specd.engine.params import SamplingParams, SpeculationConfig
from specd.engine.policies import build_policy, make_policy, policy_factory
from specd.engine.policy import SpeculationPolicy
from specd.engine.request import Detokenizer, Request
from specd.engine.scheduler import DRAFT, TARGET, SchedulerConfig
from specd.engine.structured_outputs import GrammarCompiler, structured_outputs_available
from specd.errors import InvalidArgumentError, UnknownSequenceError
from specd.kv_cache import KVCachePool, KVModel
from specd.models.kernel_choice import KernelChoice
from specd.models.llama import LlamaModel
from specd.models.loader import LoadedModel, check_compatible, load_model

Prompt = Union[str, Sequence[int]]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _graph_wanted(flag: Optional[bool], model, timer) -> bool:
    """An explicit flag as given; None (auto): a LlamaModel on a CUDA device that the graph
    runners support, timed by the wall clock (not a synthetic timer)."""
    if flag is not None:
        return bool(flag)
    from specd.engine.draft_graph import DraftGraphRunner

    device = getattr(model, "device", None)
    return (timer is None and device is not None and device.type == "cuda"
            and DraftGraphRunner.unsupported(model) is None)


def _dtype(dtype, device) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if dtype == "auto":
        from specd.hardware import auto_dtype

        dtype = auto_dtype(str(device))
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    raise InvalidArgumentError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}")


class LLM:
    """A target model (and optionally a draft model) with a paged KV cache and a speculative
    continuous-batching engine.

    dtype: "float32", "bfloat16", "float16", or "auto" (bfloat16 on CUDA and on CPUs with
        native bf16 matmul, float32 elsewhere; see specd.hardware).

    target, draft: a Hugging Face model directory, a GGUF file, or a LoadedModel.
    speculation: SpeculationConfig (default: "draft" with k=4 when a draft is given, else none).
    kv_cache_memory: bytes of the shared KV page pool (target + draft), or num_kv_pages.
    max_num_seqs / max_num_batched_tokens: continuous-batching limits per step.
    enable_prefix_caching: automatic prefix caching (on by default, as in vLLM and SGLang):
        full blocks of computed KV (target and draft) are kept, keyed by their tokens and
        everything before them, and a request whose tokens start with cached blocks adopts
        them instead of prefilling them (RequestOutput.num_cached_tokens says how many). Cached
        blocks no request uses stay in the pool until their pages are needed, least recently
        used first, so caching never takes capacity. Requests asking for prompt_logprobs
        compute their whole prompt. Outputs are those of prefilling the prompt, to float
        rounding (the cached KV came from another forward's batch).
    max_model_len: context limit (prompt + output); default the target's max positions.
    policy: a SpeculationPolicy object or a registered policy name ("none", "static",
        "switch_off", "goodput" or a plugin's); default: speculation.policy.
    timer: how forwards and steps are timed (specd.engine.timer; default wall clock).
    draft_graph: run the draft model's forwards (the catch-up and the k-step loop) as one
        fixed-shape loop over device buffers (custom-op attention; CUDA graphs per batch-size
        bucket on a GPU; see specd.engine.draft_graph). None (default): on when the draft
        model is on a CUDA device and the runner supports it (validated on an H100), else off.
        With draft-model trees (draft_tree_width > 1) it grows the trees on the device
        (specd.engine.draft_tree_graph: one host read per draft call instead of one per
        forward; validated on an H100, where it drafts 10-13x faster than the host loop).
    target_graph: run steps without a prefill chunk (every request verifying its root and
        drafts, padded to one query length; plain decoding steps are 1-row verifies) as one
        fixed-shape target forward over device buffers (custom-op tree attention; a CUDA graph
        per batch-size bucket and query length on a GPU; see specd.engine.target_graph). None
        (default): on when the target is on a CUDA device and the runner supports it, also
        without speculation, so that plain and speculative decoding attend with the same
        kernels (greedy outputs equal token for token); else off.
    fused_layers: run each decoder layer of both models as nine kernels (specd.ops layer ops
        around one matrix product for q/k/v and one for gate/up; models/llama.py) instead of
        about forty torch kernels. None (default): on for models on a CUDA device when specd has
        its CUDA kernels (for models built by the caller, ``LLM.from_models``: their own
        ``fused`` setting). True on CPU runs the float32 references (float32 models only; for
        testing). Outputs agree with the torch layers to rounding, not to the bit.
    kernels: a ``specd.KernelChoice`` for both models: which CUDA kernel variants their kernel
        paths take (models/kernel_choice.py). ``grouped_attention``: the tree attention of the
        kernel-attention forwards (the graph runners) by the split, head-grouped kernel (a
        block per query token, GQA group and KV split, partial softmax states merged: reads
        each K/V row once per group and spreads one long request over the GPU;
        cuda/tree_attention_grouped.h); ``cluster_rows``: the sampling and stochastic
        verification kernels (the draft's sampled rows, the target's verification of sampled
        requests) with a thread-block cluster per row (sm_90+). Defaults from the H100
        measurements: grouped attention for forwards of >= 512 query tokens ("auto"),
        clusters on. Same rules, equal to float rounding; no effect on the CPU (the float32
        references). None (default): each model's own ``kernels`` (LlamaModel default
        ``KernelChoice()``).
    """

    def __init__(self, target: Union[str, os.PathLike, LoadedModel], draft=None,
                 speculation: Optional[SpeculationConfig] = None, *, dtype="float32", device="cpu",
                 kv_cache_memory: int = 256 << 20, num_kv_pages: Optional[int] = None, block_size: int = 16,
                 max_num_seqs: int = 32, max_num_batched_tokens: int = 1024,
                 max_model_len: Optional[int] = None, seed: int = 0,
                 policy: Union[str, SpeculationPolicy, None] = None, timer=None,
                 draft_graph: Optional[bool] = None, target_graph: Optional[bool] = None,
                 fused_layers: Optional[bool] = None, kernels: Optional[KernelChoice] = None,
                 enable_prefix_caching: bool = True):
        torch_dtype = _dtype(dtype, device)
        if speculation is None:
            speculation = SpeculationConfig(method="draft" if draft is not None else "none")
        self._check_args(speculation, draft, max_num_seqs, max_num_batched_tokens, block_size)
        t = target if isinstance(target, LoadedModel) else load_model(target, torch_dtype)
        d = None
        if draft is not None:
            d = draft if isinstance(draft, LoadedModel) else load_model(draft, torch_dtype)
            check_compatible(t, d)
        self._setup(LlamaModel.from_loaded(t, device), LlamaModel.from_loaded(d, device) if d is not None else None,
                    t.tokenizer, speculation, device=device, kv_cache_memory=kv_cache_memory,
                    num_kv_pages=num_kv_pages, block_size=block_size, max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len, seed=seed,
                    policy=policy, timer=timer, draft_graph=draft_graph, target_graph=target_graph,
                    fused_layers=fused_layers, kernels=kernels, enable_prefix_caching=enable_prefix_caching)

    @classmethod
    def from_models(cls, target_model, draft_model=None, speculation: Optional[SpeculationConfig] = None, *,
                    tokenizer=None, device="cpu", kv_cache_memory: int = 256 << 20,
                    num_kv_pages: Optional[int] = None, block_size: int = 16, max_num_seqs: int = 32,
                    max_num_batched_tokens: int = 1024, max_model_len: Optional[int] = None, seed: int = 0,
                    policy: Union[str, SpeculationPolicy, None] = None, timer=None,
                    draft_graph: Optional[bool] = None, target_graph: Optional[bool] = None,
                    fused_layers: Optional[bool] = None, kernels: Optional[KernelChoice] = None,
                    enable_prefix_caching: bool = True) -> "LLM":
        """An LLM over models already built: objects with ``config`` (ModelConfig), ``dtype``,
        ``device``, ``window`` and LlamaModel's ``__call__(input_ids, meta, kv, indices)``
        (e.g. the trace-replay models of ``specd bench load --simulated``)."""
        if speculation is None:
            speculation = SpeculationConfig(method="draft" if draft_model is not None else "none")
        cls._check_args(speculation, draft_model, max_num_seqs, max_num_batched_tokens, block_size)
        self = cls.__new__(cls)
        self._setup(target_model, draft_model, tokenizer, speculation, device=device,
                    kv_cache_memory=kv_cache_memory, num_kv_pages=num_kv_pages, block_size=block_size,
                    max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                    max_model_len=max_model_len, seed=seed, policy=policy, timer=timer, draft_graph=draft_graph,
                    target_graph=target_graph, fused_layers=fused_layers, kernels=kernels,
                    enable_prefix_caching=enable_prefix_caching)
        return self

    @staticmethod
    def _check_args(speculation: SpeculationConfig, draft, max_num_seqs, max_num_batched_tokens,
                    block_size) -> None:
        if "draft" in speculation.methods and draft is None:
            raise InvalidArgumentError("speculation method 'draft' needs a draft model (draft=...)")
        if "draft" not in speculation.methods and draft is not None:
            raise InvalidArgumentError(f"a draft model was given but speculation.method is '{speculation.method_name}'")
        for name, value in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens),
                            ("block_size", block_size)):
            if not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1, got {value!r}")

    def _setup(self, target_model, draft_model, tokenizer, speculation: SpeculationConfig, *, device,
               kv_cache_memory, num_kv_pages, block_size, max_num_seqs, max_num_batched_tokens, max_model_len,
               seed, policy, timer, draft_graph=None, target_graph=None, fused_layers=None,
               kernels=None, enable_prefix_caching=True) -> None:
        self.tokenizer = tokenizer
        self.target, self.draft = target_model, draft_model
        _set_fused_layers(fused_layers, target_model, draft_model)
        _set_kernels(kernels, target_model, draft_model)
        tc = target_model.config
        models = [KVModel("target", tc, self.target.dtype)]
        if self.draft is not None:
            models.append(KVModel("draft", draft_model.config, self.draft.dtype))
        pages = num_kv_pages or KVCachePool.pages_for_memory(kv_cache_memory, models[0], block_size)
        self.pool = KVCachePool(models, pages, block_size, device, prefix_caching=bool(enable_prefix_caching))
        limit = tc.max_position_embeddings
        if max_model_len is not None and not (isinstance(max_model_len, int) and 2 <= max_model_len <= limit):
            raise InvalidArgumentError(f"max_model_len must be an int in [2, {limit}], got {max_model_len!r}")
        self.max_model_len = max_model_len or limit
        self.speculation = speculation
        # The configured policy's factory, found once: reset() makes a fresh policy without
        # looking its name up among the installed packages again.
        self._policy_factory = None
        if policy is None:
            policy = self._configured_policy()
        elif isinstance(policy, str):
            policy = make_policy(policy, speculation)
        self.eos_ids = frozenset(tc.eos_token_ids)
        self._grammars = GrammarCompiler(tokenizer, tc.vocab_size, self.eos_ids)
        # (no forced chain can come without xgrammar: the target graph needs no room for one)
        self._jump_forward_tokens = speculation.jump_forward_tokens if structured_outputs_available() else 0
        self._scheduler_config = SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            uses_draft_kv=self.draft is not None, k_max=speculation.k,
            model_free_tree_nodes=speculation.planner_node_budgets[0], draft_tree_width=speculation.draft_tree_width,
            draft_tree_nodes=speculation.planner_node_budgets[1],
            jump_forward_tokens=self._jump_forward_tokens)
        self._timer = timer
        self.engine = Engine(self.target, self.draft, self.pool, speculation, policy, self._scheduler_config,
                             timer=timer)
        self.draft_graph = (self._make_draft_graph(speculation, max_num_seqs)
                            if _graph_wanted(draft_graph, self.draft, timer) else None)
        self.target_graph = (self._make_target_graph(speculation, max_num_seqs, max_num_batched_tokens)
                             if _graph_wanted(target_graph, self.target, timer) else None)
        self.seed = seed
        self._next_id = 0
        self._online: dict[int, Request] = {}  # add_request's requests until step() reports their end

    def reset(self, policy: Union[str, SpeculationPolicy, None] = None) -> None:
        """Starts serving afresh, as a new LLM with the same arguments would, but keeps what is
        costly to make: the models, the KV page pool and the captured CUDA graphs. Dropped: the
        policy's learned estimates (a new policy: ``policy``, else one made from the
        speculation config), the proposers' indexes, the engine's timings and telemetry, the
        prefix cache, and the request counter (request ids, hence unseeded sampling streams,
        restart at 0).
        Raises FailedPreconditionError while requests are in flight (finish or abort them)."""
        from specd.errors import FailedPreconditionError

        if self.engine.has_work:
            raise FailedPreconditionError("LLM.reset: requests are still in flight; finish or abort them first")
        if policy is None:
            policy = self._configured_policy()
        elif isinstance(policy, str):
            policy = make_policy(policy, self.speculation)
        self.reset_prefix_cache()
        engine = Engine(self.target, self.draft, self.pool, self.speculation, policy, self._scheduler_config,
                        timer=self._timer)
        engine.draft_graph, engine.target_graph = self.draft_graph, self.target_graph
        engine.device_drafts = self.engine.device_drafts
        self.engine = engine
        self._next_id = 0
        self._online.clear()  # only ended requests can be left (their final chunks are dropped)

    @property
    def prefix_caching(self) -> bool:
        return bool(self.pool.blocks.prefix_caching)

    def prefix_cache_stats(self) -> dict:
        """Prefix-cache figures: since this engine started (LLM.reset starts a new one),
        ``admissions`` that looked the cache up, their ``query_tokens`` and the ``hit_tokens``
        found, with ``hit_rate`` = hit_tokens / query_tokens; of the pool, ``cached_pages``,
        ``evictable_pages`` (cached, used by no request), ``evictions`` and ``hit_pages``
        (adopted, target and draft) since creation or the last reset_prefix_cache. Empty
        without prefix caching."""
        stats = self.engine.scheduler.prefix_stats
        if stats:
            stats["hit_rate"] = stats["hit_tokens"] / stats["query_tokens"] if stats["query_tokens"] else 0.0
        return stats

    def reset_prefix_cache(self) -> None:
        """Forgets every cached block and zeroes the pool's eviction and hit counts (for
        benchmarks that compare cold and warm runs)."""
        self.pool.blocks.reset_prefix_cache()

    def _configured_policy(self) -> SpeculationPolicy:
        """A new policy of the speculation config's ``policy``."""
        if self._policy_factory is None:
            self._policy_factory = policy_factory(self.speculation.policy)
        return build_policy(self.speculation.policy, self._policy_factory, self.speculation)

    def capture_cuda_graphs(self, sampling: bool = False) -> dict:
        """Captures, now, every CUDA graph the graph runners would otherwise capture on first
        use: each batch bucket with every verify length the speculation plans (target) and
        every catch-up width and draft step (draft), for greedy rows (and sampled rows with
        ``sampling=True``). Longer jump-forward chains (structured outputs) are captured when
        a request first has one. A server
        calls this at start-up so that no request waits for a capture; benchmarks call it
        before timing. Returns ``{"graphs": number captured by this call, "seconds": ...}``;
        nothing to do (0 graphs) without runners or on the CPU."""
        start = time.perf_counter()
        modes = (False, True) if sampling else (False,)
        count = 0
        for runner in (self.draft_graph, self.target_graph):
            if runner is not None and runner.capture:
                count += runner.capture_all(modes)
        return {"graphs": count, "seconds": time.perf_counter() - start}

    def _make_draft_graph(self, speculation: SpeculationConfig, max_num_seqs: int):
        """The DraftGraphRunner of the draft model (a DraftTreeGraphRunner for draft-model trees),
        handed to the engine (which passes it to run_draft or run_draft_tree)."""
        from specd.engine.draft_graph import DraftGraphConfig, DraftGraphRunner, power_of_two_buckets

        if self.draft is None:
            raise InvalidArgumentError("draft_graph=True needs a draft model (speculation method 'draft')")
        on_gpu = self.draft.device.type == "cuda"
        width = self.pool.blocks.pages_for_tokens(self.max_model_len + speculation.k + 1, model=DRAFT)
        config = DraftGraphConfig(max_steps=max(speculation.k, 1), max_blocks=width,
                                  buckets=power_of_two_buckets(max_num_seqs) if on_gpu else ())
        if speculation.draft_tree_width > 1:  # draft-model trees grown on the device
            from specd.engine.draft_tree_graph import DraftTreeGraphRunner

            runner = DraftTreeGraphRunner(self.draft, self.pool, config, speculation.draft_tree_width)
        else:
            runner = DraftGraphRunner(self.draft, self.pool, config)
        self.engine.draft_graph = runner
        return runner

    def _make_target_graph(self, speculation: SpeculationConfig, max_num_seqs: int, max_num_batched_tokens: int):
        """The TargetGraphRunner of the target model, handed to the engine (which passes it to run_target)."""
        from specd.engine.draft_graph import power_of_two_buckets
        from specd.engine.target_graph import TargetGraphConfig, TargetGraphRunner

        k = speculation.k
        # root + the most draft nodes a request reserves (a jump-forward chain included; its
        # lengths beyond the speculation's are captured when first run)
        planned = 1 + max(k, speculation.tree_nodes(k), speculation.draft_tree_nodes(k))
        max_query = max(planned, 1 + self._jump_forward_tokens)
        on_gpu = self.target.device.type == "cuda"
        width = self.pool.blocks.pages_for_tokens(self.max_model_len + max_query, model=TARGET)
        runner = TargetGraphRunner(self.target, self.pool, TargetGraphConfig(
            max_query=max_query, max_blocks=width, buckets=power_of_two_buckets(max_num_seqs) if on_gpu else (),
            max_tokens=max(max_num_batched_tokens, max_query), capture_query=planned))
        self.engine.target_graph = runner
        return runner

    # ---- requests ----

    def _tokenize(self, prompt: Prompt) -> tuple[Optional[str], list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidArgumentError("this model has no tokenizer: pass prompts as lists of token ids")
            return prompt, list(self.tokenizer(prompt)["input_ids"])
        vocab = self.target.config.vocab_size
        try:
            ids = np.asarray(prompt)
        except (TypeError, ValueError) as e:  # e.g. ragged nested lists
            raise InvalidArgumentError(f"prompt token ids must be ints in [0, {vocab}): {e}") from None
        # One vectorised check (a 2,000-token prompt: ~0.1 ms instead of ~1 ms per element);
        # numpy integer ids are accepted and become Python ints.
        if ids.ndim != 1 or (ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= vocab)):
            raise InvalidArgumentError(f"prompt token ids must be ints in [0, {vocab}), one list per prompt")
        return None, ids.tolist()

    def _make_request(self, prompt: Prompt, params: SamplingParams,
                      tokenized: Optional[tuple[Optional[str], list[int]]] = None) -> Request:
        if not isinstance(params, SamplingParams):
            raise InvalidArgumentError(f"params must be a specd.SamplingParams, got {type(params).__name__}")
        text, ids = tokenized if tokenized is not None else self._tokenize(prompt)
        vocab = self.target.config.vocab_size
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise InvalidArgumentError(f"logit_bias has token id {max(params.logit_bias)}, outside the vocabulary "
                                       f"[0, {vocab})")
        if not ids:
            raise InvalidArgumentError("the prompt is empty (no tokens)")
        if len(ids) >= self.max_model_len:
            raise InvalidArgumentError(f"the prompt has {len(ids)} tokens and does not fit the context limit of "
                                       f"{self.max_model_len} tokens (max_model_len) with room for output")
        rid = self._next_id
        self._next_id += 1
        seeded = params.seed is not None
        req = Request(rid, text, ids, params, rng_seed=params.seed if seeded else self.seed,
                      rng_request=0 if seeded else rid, max_len=self.max_model_len, eos_ids=self.eos_ids,
                      detokenizer=Detokenizer(self.tokenizer, ids) if self.tokenizer is not None else None)
        if params.structured_outputs is not None:
            req.grammar = self._grammars.compile(params.structured_outputs)
        self._check_fits(req)
        return req

    def _check_fits(self, req: Request) -> None:
        """A request that could not fit the whole pool alone would never finish: refuse it."""
        tokens = min(req.length + req.params.max_tokens, self.max_model_len) + self.speculation.k + 1
        pages = sum(self.pool.blocks.pages_for_tokens(tokens, model=m) for m in range(len(self.pool.models)))
        if pages > self.pool.blocks.num_pages:
            raise InvalidArgumentError(f"a request of {req.length} prompt tokens and max_tokens "
                                       f"{req.params.max_tokens} needs {pages} KV pages; the pool has "
                                       f"{self.pool.blocks.num_pages} (raise kv_cache_memory)")

    def _requests(self, prompts, params, what: Optional[str] = None) -> list[Request]:
        """One request per prompt; ``what`` (the caller's name) refuses SamplingParams.n > 1."""
        groups = self._request_groups(prompts, params)
        if what is not None and any(len(g) > 1 for g in groups):
            raise InvalidArgumentError(f"{what} takes SamplingParams.n = 1 (add each completion: "
                                       "SamplingParams.completions()); LLM.generate takes any n")
        return [g[0] for g in groups]

    def _request_groups(self, prompts, params) -> list[list[Request]]:
        """Per prompt, the requests of its SamplingParams.n completions (all validated first)."""
        if isinstance(prompts, np.ndarray):  # one prompt of ids (1-D), or one per row
            prompts = [prompts] if prompts.ndim == 1 else list(prompts)
        elif isinstance(prompts, str) or (prompts and isinstance(prompts[0], (int, np.integer))):
            prompts = [prompts]
        if isinstance(params, SamplingParams) or params is None:
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise InvalidArgumentError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        groups = []
        for p, sp in zip(prompts, params):
            first = self._make_request(p, sp)
            if not isinstance(sp, SamplingParams) or sp.n == 1:
                groups.append([first])
                continue
            children = sp.completions()
            first.params = children[0]
            tokenized = (first.prompt, first.prompt_ids)
            groups.append([first] + [self._make_request(p, c, tokenized) for c in children[1:]])
        return groups

    def metrics(self) -> dict:
        """Engine-wide speculation telemetry since the LLM was made (see Engine.metrics), with
        ``prefix_cache`` (prefix_cache_stats()) when prefix caching is on."""
        out = self.engine.metrics()
        if self.prefix_caching:
            out["prefix_cache"] = self.prefix_cache_stats()
        return out

    # ---- generation ----

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 params: Union[SamplingParams, Sequence[SamplingParams], None] = None) -> list[RequestOutput]:
        """Generates for every prompt (batched); outputs in the order of the prompts, each with
        its SamplingParams.n completions in ``outputs``. A prompt's completions after the first
        wait, with prefix caching, until the first has computed the prompt, and adopt its KV
        (the prompt is prefilled once)."""
        groups = self._request_groups(prompts, params)  # validates everything before starting
        requests = [r for g in groups for r in g]
        for g in groups:
            self.engine.add(g[0])
            for req in g[1:]:
                self.engine.add(req, follows=g[0])
        pending = {r.id for r in requests}  # not a scan of every request per step (large batches)
        try:
            while pending:
                for done in self.engine.step():
                    pending.discard(done.id)
        except BaseException:
            for req in requests:
                if not req.finished:
                    self.engine.abort(req)
            raise
        return [_merged(g) for g in groups]

    def stream(self, prompt: Prompt, params: Optional[SamplingParams] = None) -> Iterator[StreamChunk]:
        """Generates for one prompt, yielding the new text and tokens after every step."""
        req = self._requests(prompt, params, "LLM.stream")[0]
        self.engine.add(req)
        try:
            while True:
                if not req.finished:
                    self.engine.step()
                chunk = _next_chunk(req)
                if chunk is not None:
                    yield chunk
                if req.finished:
                    return
        finally:
            if not req.finished:
                self.engine.abort(req)

    # ---- online serving (continuous batching driven by the caller) ----

    def add_request(self, prompt: Prompt, params: Optional[SamplingParams] = None,
                    follows: Optional[int] = None) -> int:
        """Queues one request and returns its id; it joins the running batch at the next
        ``step()``. Requests may be added between any two steps. It is validated as in
        ``generate`` (``InvalidArgumentError``; nothing is queued then). ``follows``: the id
        of an unfinished request of add_request with the same prompt (another completion of
        it, e.g. SamplingParams.completions()): with prefix caching this one waits until that
        one has computed the prompt, then adopts its KV instead of prefilling it again."""
        req = self._requests(prompt, params, "LLM.add_request")[0]
        req.online = True  # step() reports it when the engine touches it (Engine.touched)
        self.engine.add(req, follows=self._online.get(follows) if follows is not None else None)
        self._online[req.id] = req
        return req.id

    def step(self) -> list[StreamChunk]:
        """Runs one engine step over all unfinished requests and returns a ``StreamChunk`` for
        each request of ``add_request`` that has new tokens or text since its last chunk, or
        has ended (its final chunk: ``finished``, ``finish_reason``, ``metrics``, ``error``);
        a request aborted since the last call gets its final chunk here. Requests of
        ``generate`` and ``stream`` are not reported; while those run, online requests
        progress too and their tokens come with the next ``step()``. [] when nothing is
        pending."""
        if self.engine.has_work:
            self.engine.step()
        # Only requests that steps scheduled or that ended since the last call can have
        # something to report: a queue of waiting requests costs nothing here.
        touched = self.engine.touched
        ids = sorted(rid for rid in touched if rid in self._online)  # in the order they were added
        touched.clear()
        chunks = []
        for rid in ids:
            req = self._online[rid]
            chunk = _next_chunk(req)
            if chunk is not None:
                chunks.append(chunk)
            if req.finished:
                del self._online[rid]
        return chunks

    def abort_request(self, request_id: int) -> bool:
        """Stops a request of ``add_request`` and frees its KV pages; its final chunk
        (finish_reason "abort") comes with the next ``step()``. Returns False when the request
        has already ended (the race of a server's cancel with the last step).
        ``UnknownSequenceError`` for an id that ``add_request`` never returned."""
        req = self._online.get(request_id)
        if req is None:
            if isinstance(request_id, int) and 0 <= request_id < self._next_id:
                return False  # ended and reported, or a request of generate/stream
            raise UnknownSequenceError(f"abort_request: no request {request_id!r} was added to this LLM")
        if req.finished:
            return False
        self.engine.abort(req)
        return True

    def prompt_token_ids(self, request_id: int) -> list[int]:
        """The prompt's token ids of a request of ``add_request`` that has not had its final
        chunk yet (``UnknownSequenceError`` otherwise)."""
        req = self._online.get(request_id)
        if req is None:
            raise UnknownSequenceError(f"prompt_token_ids: no request {request_id!r} in flight")
        return list(req.prompt_ids)

    def has_unfinished_requests(self) -> bool:
        """Whether a request of ``add_request`` has not had its final chunk from ``step()`` yet."""
        return bool(self._online)


def _merged(group: list[Request]) -> RequestOutput:
    """A prompt's output: completion 0's fields, and every completion in ``outputs``."""
    outs = [r.output() for r in group]
    if len(outs) > 1:
        outs[0].outputs = [CompletionOutput(i, o.text, o.token_ids, o.finish_reason, o.metrics, o.error, o.logprobs,
                                            o.cumulative_logprob) for i, o in enumerate(outs)]
    return outs[0]


def _next_chunk(req: Request) -> Optional[StreamChunk]:
    """The request's output since its last chunk (``req.stream_sent``), or None when it has
    nothing new and has not ended."""
    chars, toks = req.stream_sent
    pieces = req.pieces  # first: the text then advances with them (Request.text)
    if len(req.text) == chars and len(req.output_ids) == toks and not req.finished:
        return None
    req.stream_sent = (len(req.text), len(req.output_ids))
    return StreamChunk(req.id, req.text[chars:], req.output_ids[toks:], req.finished, req.finish_reason,
                       req.accepted_flags[toks:], pieces[toks:], req.metrics if req.finished else None,
                       req.error, req.logprobs_from(toks), req.decoded_prompt_logprobs() if toks == 0 else None)


def _set_fused_layers(fused_layers: Optional[bool], *models) -> None:
    """LLM's ``fused_layers`` on every LlamaModel given (other model objects have no layers);
    None leaves each model's ``fused`` as it is (by default None: fused on CUDA)."""
    if fused_layers not in (None, True, False):
        raise InvalidArgumentError(f"fused_layers must be None, True or False, got {fused_layers!r}")
    for model in models:
        if not isinstance(model, LlamaModel):
            continue
        if fused_layers and model.device.type == "cpu" and model.dtype != torch.float32:
            raise InvalidArgumentError(f"fused_layers=True on the CPU runs the float32 references; the model is "
                                       f"{model.dtype} (use dtype='float32', or leave fused_layers unset)")
        if fused_layers and model.device.type == "cuda" and not _ops_have_cuda():
            raise InvalidArgumentError("fused_layers=True on CUDA needs a specd build with CUDA kernels")
        if fused_layers is not None:  # None keeps the model's own setting (LlamaModel.fused)
            model.fused = fused_layers


def _set_kernels(kernels: Optional[KernelChoice], *models) -> None:
    """LLM's ``kernels`` on every LlamaModel given; None leaves each model's own."""
    if kernels is not None and not isinstance(kernels, KernelChoice):
        raise InvalidArgumentError(f"kernels must be a specd.KernelChoice or None, got {kernels!r}")
    for model in models:
        if kernels is not None and isinstance(model, LlamaModel):
            model.kernels = kernels


def _ops_have_cuda() -> bool:
    import specd.ops as ops

    return ops.HAS_CUDA_KERNELS
