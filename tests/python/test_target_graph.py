"""The graph-capturable target verify forward (specd.engine.target_graph): with
``LLM(..., target_graph=True)`` the engine's greedy outputs equal plain decoding for ngram /
suffix / draft proposals, chains and trees, mixed tree sizes in a batch (query padding),
batches padded to buckets and crossing them, and steps with prefill chunks (which run the
plain path); every verify step the runner takes gives the logits the plain forward gives.
GPU: the captured graph replays what the runner's eager forward computes, with no host
synchronisation (skips without a GPU)."""

import numpy as np
import pytest
import torch

import specd
from specd import errors
from specd.engine import batch_verify, model_runner
from specd.engine.params import SamplingParams
from specd.engine.policy import Decision, StaticPolicy
from specd.engine.structured_outputs import structured_outputs_available
from specd.engine.target_graph import TargetGraphConfig, TargetGraphRunner
from specd.verification import TokenTree
from test_engine import prompts_of_mixed_lengths, self_draft

MAX_TOKENS = 20
BUDGET = 96  # new tokens per step: prompts are prefilled in chunks beside verifying requests
# Trees: several n-gram continuations merged (up to 6 nodes), so tree sizes differ in a step.
SPECS = {"ngram-tree": dict(method="ngram", num_speculative_tokens=3, max_tree_nodes=6, ngram_candidates=3,
                            ngram_max=2),
         "suffix": dict(method="suffix", num_speculative_tokens=3),
         "draft": dict(method="draft", num_speculative_tokens=3)}


def greedy_params(n):
    """Different max_tokens per request: requests finish at different steps, so the batch
    shrinks across the buckets."""
    return [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS - 2 * (i % 4), ignore_eos=True) for i in range(n)]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory, tiny_llama_dir, tiny_qwen2_dir):
    target = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}[request.param]
    draft = self_draft(target, tmp_path_factory.mktemp(f"target_graph_draft_{request.param}"))
    plain = specd.LLM(target, max_num_batched_tokens=BUDGET)
    prompts = prompts_of_mixed_lengths(plain.tokenizer)
    baseline = [o.token_ids for o in plain.generate(prompts, greedy_params(len(prompts)))]
    return target, draft, prompts, baseline


class BranchyTrees:
    """Wraps the n-gram proposer: every proposal grows extra branches of random tokens, to a
    random size within the request's node budget and depth k. Tiny random models often repeat
    one token (n-gram lookup then finds chains only); this makes every verify step carry token
    trees of several sizes. Verification is lossless whatever the drafts are."""

    def __init__(self, inner, vocab: int):
        self.inner, self.vocab = inner, vocab

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __contains__(self, request_id) -> bool:
        return request_id in self.inner

    def propose(self, ids, ks, nodes):
        out = self.inner.propose(ids, ks, nodes)
        return _Trees([self._grow(out.tree(i), rid, k, n) for i, (rid, k, n) in enumerate(zip(ids, ks, nodes))])

    def _grow(self, tree: TokenTree, rid: int, k: int, nodes: int) -> TokenTree:
        rng = np.random.default_rng([rid, len(tree), int(tree.tokens[0])])
        grown = TokenTree.from_parents(tree.tokens, tree.parents)
        size = int(rng.integers(len(tree), nodes + 2))  # root + at most `nodes` drafts
        while len(grown) < size:
            parents = [j for j, d in enumerate(grown.depths) if d < k]
            parent, token = int(rng.choice(parents)), int(rng.integers(0, self.vocab))
            if grown.find_child(parent, token) < 0:
                grown.add_node(parent, token)
        return grown


class _Trees:
    def __init__(self, trees):
        self.trees = trees

    def tree(self, i: int) -> TokenTree:
        return self.trees[i]


def make_llm(target, draft, spec, **kw):
    s = dict(SPECS[spec])
    llm = specd.LLM(target, draft if s["method"] == "draft" else None, specd.SpeculationConfig(**s),
                    max_num_batched_tokens=BUDGET, **kw)
    if spec == "ngram-tree":
        proposers = llm.engine.proposers
        proposers["ngram"] = BranchyTrees(proposers["ngram"], llm.target.config.vocab_size)
    return llm


class _Calls(list):
    """checked_run_target's record (a list with a device_drafts attribute)."""


def checked_run_target(monkeypatch, calls):
    """Makes every engine verify forward run the plain path first, then the path with the
    engine's runner on the same items (the KV writes are the same rows, equal up to rounding),
    and compare their logits. Records (runner used, batch size, tree sizes, all chains); a
    step whose draft chains stayed on the device (``drafts``) runs the plain path on the trees
    with the drafts read, the runner's on the placeholder trees, and is recorded in
    ``calls.device_drafts`` as (drafting items, items)."""
    real = model_runner.run_target
    calls.device_drafts = []

    def run(model, pool, items, trees, graph=None, drafts=None):
        assert graph is not None  # the engine passes its runner
        read = dict(trees)
        if drafts is not None:
            for it, chain in zip(drafts.items, drafts.to_host()):
                assert trees[it.request.id].tokens[1:].tolist() == [0] * it.k  # placeholders
                read[it.request.id] = TokenTree.chain(it.request.tokens[-1], chain)
            calls.device_drafts.append((len(drafts.items), len(items)))
        want = real(model, pool, items, read)
        got = real(model, pool, items, trees, graph=graph, drafts=drafts)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        sizes = [len(trees[it.request.id]) for it in items if it.decide]
        chains = all(trees[it.request.id].is_chain for it in items if it.decide)
        calls.append((graph.accepts(items, trees), len(items), sizes, chains))
        return got

    monkeypatch.setattr(model_runner, "run_target", run)


def runner_like(llm, **config):
    """A CPU runner for ``llm``'s target with the given config fields (no capture)."""
    old = llm.target_graph.config
    fields = dict(max_query=old.max_query, max_blocks=old.max_blocks, buckets=old.buckets, capture=False)
    fields.update(config)
    runner = TargetGraphRunner(llm.target, llm.pool, TargetGraphConfig(**fields))
    llm.target_graph = llm.engine.target_graph = runner
    return runner


# ---- CPU: the engine with the target graph ----


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_engine_greedy_with_target_graph_equals_plain_decoding(pair, monkeypatch, spec):
    target, draft, prompts, baseline = pair
    llm = make_llm(target, draft, spec, target_graph=True)
    assert isinstance(llm.target_graph, TargetGraphRunner) and llm.engine.target_graph is llm.target_graph
    # room for the speculation's largest tree, and for a jump-forward chain where xgrammar is installed
    jump = llm.speculation.jump_forward_tokens if structured_outputs_available() else 0
    assert llm.target_graph.config.max_query == 1 + max(6 if spec == "ngram-tree" else 3, jump)
    assert llm.target_graph.config.capture_query == 1 + (6 if spec == "ngram-tree" else 3)  # (captured up front)
    calls = _Calls()
    checked_run_target(monkeypatch, calls)
    outs = llm.generate(prompts, greedy_params(len(prompts)))
    assert [o.token_ids for o in outs] == baseline
    assert sum(o.metrics.accepted_tokens for o in outs) > 0, "speculation did not happen"
    assert any(used for used, _, _, _ in calls)
    assert any(not used for used, _, _, _ in calls)  # steps with prefill chunks ran the plain path
    assert any(used and len(set(sizes)) > 1 for used, _, sizes, _ in calls)  # padded query rows
    if spec == "ngram-tree":
        assert any(used and not chains for used, _, _, chains in calls)  # token trees through the runner
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages


def test_batch_buckets_overflow_and_query_limit(pair, monkeypatch):
    """Buckets (3, 5): 8 or 6 requests overflow them (plain path), then the shrinking batch is
    padded to 5 or 3; runners limited to q <= 3, or to 8 padded rows, leave larger steps to
    the plain path."""
    target, draft, prompts, baseline = pair
    # (Without prefix caching: the steps at which requests finish, hence the batch sizes this
    # test walks through, assume every prompt is prefilled in full.)
    llm = make_llm(target, draft, "ngram-tree", target_graph=True, enable_prefix_caching=False)
    runner = runner_like(llm, buckets=(3, 5))
    calls = _Calls()
    checked_run_target(monkeypatch, calls)
    assert [o.token_ids for o in llm.generate(prompts, greedy_params(len(prompts)))] == baseline
    pure = [(used, n) for used, n, sizes, _ in calls if len(sizes) == n]  # no prefill in the step
    assert any(not used and n > 5 for used, n in pure)  # bucket overflow
    assert all(used for used, n in pure if n <= 5)
    assert any(used and runner.bucket(n) != n for used, n in pure)  # padded batches
    assert {b for b, _ in runner._buffers} == {3, 5}

    assert runner._logits is not None and runner._logits.shape[0] == 5 * runner.config.max_query

    for spec, limits in (("ngram-tree", dict(max_query=3)), ("suffix", dict(max_tokens=8))):
        limited = make_llm(target, draft, spec, target_graph=True)
        runner_like(limited, **limits)
        calls.clear()
        assert [o.token_ids for o in limited.generate(prompts, greedy_params(len(prompts)))] == baseline
        pure = [(used, n * max(sizes), max(sizes)) for used, n, sizes, _ in calls if len(sizes) == n]
        assert any(used for used, _, _ in pure)
        if spec == "ngram-tree":  # trees above max_query ran the plain path
            assert all(q <= 3 for used, _, q in pure if used) and any(not used and q > 3 for used, _, q in pure)
        else:  # steps of more than max_tokens padded rows ran the plain path
            assert all(rows <= 8 for used, rows, _ in pure if used)
            assert any(not used and rows > 8 for used, rows, _ in pure)


@pytest.mark.parametrize("device_drafts", [True, False])
def test_draft_and_target_graphs_together(pair, monkeypatch, device_drafts):
    """Both runners: the draft chains go from the draft runner's buffers into the verify
    inputs on the device (Engine.device_drafts, the default) or through the host; greedy
    outputs equal plain decoding either way."""
    target, draft, prompts, baseline = pair
    llm = make_llm(target, draft, "draft", target_graph=True, draft_graph=True)
    llm.engine.device_drafts = device_drafts
    calls = _Calls()
    checked_run_target(monkeypatch, calls)
    assert [o.token_ids for o in llm.generate(prompts, greedy_params(len(prompts)))] == baseline
    assert any(used for used, _, _, _ in calls)
    assert bool(calls.device_drafts) == device_drafts


class VaryingK(StaticPolicy):
    """k = (request id + step) mod (k + 1) per request: steps mix requests with k = 0 (no
    drafts), short and full chains."""

    def __init__(self, k: int):
        super().__init__(k, ("draft",))
        self.steps = 0

    def decide(self, batch):
        self.steps += 1
        return [Decision(min((s.request.id + self.steps) % (self.k + 1), s.k_max), "draft") for s in batch]


def test_device_drafts_with_mixed_k_and_sampling(pair, monkeypatch):
    """Device-resident drafts (both runners) in steps that mix requests without drafts and
    chains of several lengths (draftless requests' dummy rows fed column 0, rows past a short chain): greedy
    outputs equal plain decoding, and seeded sampled outputs equal those of drafts read
    through the host."""
    target, draft, prompts, baseline = pair
    llm = make_llm(target, draft, "draft", target_graph=True, draft_graph=True, policy=VaryingK(3))
    calls = _Calls()
    checked_run_target(monkeypatch, calls)
    assert [o.token_ids for o in llm.generate(prompts, greedy_params(len(prompts)))] == baseline
    assert calls.device_drafts and any(n < m for n, m in calls.device_drafts)  # a step with k = 0 requests
    monkeypatch.undo()
    params = [SamplingParams(temperature=0.0 if i % 3 == 0 else 0.8, top_p=0.95, max_tokens=MAX_TOKENS,
                             ignore_eos=True, seed=i) for i in range(len(prompts))]
    # Device drafts are copied to the host once per step, with the verification results.
    real_read, copies = model_runner.DeviceDrafts.read, []

    def read(self, extra=None):
        copies.append((self, self._host is None or extra is not None))  # (kept alive: ids stay unique)
        return real_read(self, extra)

    monkeypatch.setattr(model_runner.DeviceDrafts, "read", read)
    # What verification (from the target's logits, the default) is given: on the device path
    # the draft rows where the runner wrote them (draft_index) with their totals.
    real_verify, given = batch_verify.verify_stochastic_logits, {True: [], False: []}

    def verify(*args, **kwargs):
        given[on_device].append((kwargs["draft_index"] is not None, kwargs["draft_totals"] is not None))
        return real_verify(*args, **kwargs)

    monkeypatch.setattr(batch_verify, "verify_stochastic_logits", verify)
    got = {}
    for on_device in (True, False):
        llm = make_llm(target, draft, "draft", target_graph=True, draft_graph=True, policy=VaryingK(3))
        llm.engine.device_drafts = on_device
        got[on_device] = [o.token_ids for o in llm.generate(prompts, params)]
    assert got[True] == got[False]
    assert (True, True) in given[True]  # drafted requests, read in the runner's buffers
    assert (True, True) not in given[False]  # host-read drafts: no draft totals
    # Verified from probability rows (sampling_probs, then verify_stochastic with the target
    # rows' totals): the same outputs.
    real_rows, with_totals = batch_verify.verify_stochastic, []

    def verify_rows(*args, **kwargs):
        with_totals.append(kwargs["target_totals"] is not None)
        return real_rows(*args, **kwargs)

    monkeypatch.setattr(batch_verify, "verify_stochastic", verify_rows)
    on_device = True
    llm = make_llm(target, draft, "draft", target_graph=True, draft_graph=True, policy=VaryingK(3))
    llm.engine.verify_from_logits = False
    assert [o.token_ids for o in llm.generate(prompts, params)] == got[True]
    assert with_totals and all(with_totals)
    per_step = {}
    for step, copied in copies:
        per_step[id(step)] = per_step.get(id(step), 0) + copied
    assert per_step and set(per_step.values()) == {1}


def test_device_drafts_read_with_the_verification_results_in_one_copy():
    """DeviceDrafts.read: each item's first k drafts of its column, and the extra tensor back
    (what verification queued); the drafts are kept, so a later read copies nothing."""
    from types import SimpleNamespace

    tokens = torch.arange(12, dtype=torch.int64).view(3, 4)  # [k 3, n 4]
    items = [SimpleNamespace(k=k) for k in (3, 1, 2, 3)]
    drafts = model_runner.DeviceDrafts(tokens, items)
    chains, extra = drafts.read(torch.tensor([7, -1, 5]))
    assert chains == [[0, 4, 8], [1], [2, 6], [3, 7, 11]] == drafts.to_host()
    assert extra.tolist() == [7, -1, 5]
    assert drafts.read()[1] is None
    tokens.fill_(-5)  # a second read without extra returns the kept chains, not a new copy
    assert drafts.to_host() == chains


def test_sampled_requests_with_target_graph(pair):
    """Sampled requests verify through the runner's logits: the same tokens as the plain path
    for the same seeds (the logits agree to float rounding), and reproducible."""
    target, draft, prompts, _ = pair
    params = [SamplingParams(temperature=0.0 if i % 3 == 0 else 0.8, top_k=(i % 2) * 20, top_p=0.95,
                             max_tokens=MAX_TOKENS, ignore_eos=True, seed=i) for i in range(len(prompts))]
    want = [o.token_ids for o in make_llm(target, draft, "draft").generate(prompts, params)]
    got = [o.token_ids for o in make_llm(target, draft, "draft", target_graph=True).generate(prompts, params)]
    assert got == want


def test_target_graph_option_errors(pair):
    target, draft, _, _ = pair
    with pytest.raises(errors.InvalidArgumentError, match="float32 only"):
        specd.LLM(target, dtype="bfloat16", target_graph=True)
    assert specd.LLM(target).target_graph is None  # default: off on a CPU
    plain = specd.LLM(target, target_graph=True)  # no speculation: q = 1, or a jump-forward chain
    jump = plain.speculation.jump_forward_tokens if structured_outputs_available() else 0
    assert plain.target_graph.config.max_query == 1 + jump and plain.target_graph.config.buckets == ()
    off = specd.LLM(target, None, specd.SpeculationConfig(jump_forward_tokens=0), target_graph=True)
    assert off.target_graph.config.max_query == 1 and plain.target_graph.config.capture_query == 1
    with pytest.raises(errors.InvalidArgumentError, match="capture"):
        TargetGraphRunner(plain.target, plain.pool, TargetGraphConfig(max_query=2, max_blocks=4, capture=True))
    with pytest.raises(errors.InvalidArgumentError, match="invalid TargetGraphConfig"):
        TargetGraphRunner(plain.target, plain.pool, TargetGraphConfig(max_query=0, max_blocks=4))
    with pytest.raises(errors.InvalidArgumentError, match="invalid TargetGraphConfig"):
        TargetGraphRunner(plain.target, plain.pool, TargetGraphConfig(max_query=2, max_blocks=4, capture_query=0))


def test_kernel_choice_reaches_every_kernel_attention_and_draft_sampling(pair, monkeypatch):
    """LLM(kernels=KernelChoice(...)) sets both models' kernels: both runners' KernelAttention and
    the kernel-attention forwards pass grouped=True to the attention op, the draft's sampled
    rows (graph runner and plain loop) pass cluster=True to the sampling op, and the sampled
    requests' verification passes cluster=True to verify_stochastic. On the CPU the ops
    run the float32 references either way, so outputs equal the default kernels'."""
    target, draft, prompts, baseline = pair
    seen = {"grouped": [], "cluster": [], "gumbel": []}
    real_attention = torch.ops.specd.tree_attention
    real_sample = torch.ops.specd.sample_tokens_and_probs
    real_sample_out = torch.ops.specd.sample_tokens_and_probs_out

    def attention(*args):
        seen["grouped"].append(args[8])  # (q, k, v, table, query_start, kv_lens, mask, scale, grouped, tree_lens)
        return real_attention(*args)

    def sample(*args):  # (logits, params, keys, cluster, gumbel)
        seen["cluster"].append(args[3])
        seen["gumbel"].append(args[4])
        return real_sample(*args)

    def sample_out(*args):  # (logits, params, keys, probs, cluster, gumbel)
        seen["cluster"].append(args[4])
        seen["gumbel"].append(args[5])
        return real_sample_out(*args)

    for name, fn in (("tree_attention", attention), ("sample_tokens_and_probs", sample),
                     ("sample_tokens_and_probs_out", sample_out)):
        monkeypatch.setattr(torch.ops.specd, name, fn, raising=False)
    import specd.engine.batch_verify as batch_verify

    real_verify = batch_verify.verify_stochastic_logits

    def verify(*args, cluster=False, **kwargs):
        seen["verify"].append(cluster)
        return real_verify(*args, cluster=cluster, **kwargs)

    seen["verify"] = []
    monkeypatch.setattr(batch_verify, "verify_stochastic_logits", verify)
    both = specd.KernelChoice(grouped_attention=True, cluster_rows=True)
    llm = make_llm(target, draft, "draft", target_graph=True, draft_graph=True, kernels=both)
    assert llm.target.kernels == both and llm.draft.kernels == both
    assert llm.target_graph.backend.grouped and llm.draft_graph.backend.grouped
    assert [o.token_ids for o in llm.generate(prompts, greedy_params(len(prompts)))] == baseline
    sampled = [SamplingParams(temperature=0.8, top_p=0.9, max_tokens=MAX_TOKENS, ignore_eos=True, seed=i)
               for i in range(len(prompts))]
    want = [o.token_ids for o in make_llm(target, draft, "draft", target_graph=True, draft_graph=True)
            .generate(prompts, sampled)]
    seen["grouped"].clear()  # the calls of `want`'s LLM (default kernels)
    seen["cluster"].clear()
    seen["verify"].clear()
    assert [o.token_ids for o in llm.generate(prompts, sampled)] == want
    eager = make_llm(target, draft, "draft", kernels=both)  # the plain draft loop
    assert [o.token_ids for o in eager.generate(prompts, sampled)] == want
    assert seen["grouped"] and all(seen["grouped"])
    assert seen["cluster"] and all(seen["cluster"])
    assert not any(seen["gumbel"])  # KernelChoice.draw keeps its default, the inverse-CDF draw
    assert seen["verify"] and all(seen["verify"])  # the target's verification of sampled requests
    default = make_llm(target, draft, "draft", target_graph=True)
    assert default.target.kernels == specd.KernelChoice() and default.target_graph.backend.grouped == "auto"
    with pytest.raises(errors.InvalidArgumentError, match="kernels must be a specd.KernelChoice"):
        specd.LLM(target, kernels="grouped")
    with pytest.raises(errors.InvalidArgumentError, match="must be a bool or 'auto'"):
        specd.KernelChoice(grouped_attention="yes")
    with pytest.raises(errors.InvalidArgumentError, match="cluster_rows must be a bool"):
        specd.KernelChoice(cluster_rows="auto")


def test_graph_runners_default_on_cuda_only():
    """draft_graph / target_graph = None: on for a supported model on a CUDA device with the
    wall-clock timer; explicit flags win; CPU models, synthetic timers and unsupported models
    stay on the torch path."""
    from specd.engine.llm import _graph_wanted

    class OnDevice:
        def __init__(self, device):
            self.device = torch.device(device)

    assert not _graph_wanted(None, None, None)  # no draft model
    assert not _graph_wanted(None, OnDevice("cpu"), None)
    assert not _graph_wanted(None, OnDevice("cuda"), None)  # not a LlamaModel: unsupported
    assert _graph_wanted(True, OnDevice("cpu"), None) and not _graph_wanted(False, OnDevice("cuda"), None)


# ---- GPU ----


@pytest.fixture
def cuda():
    import specd.ops as ops

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the CUDA graph capture and replay need one")
    if not ops.HAS_CUDA_KERNELS:
        pytest.skip("specd built without CUDA kernels (kv_write / tree_attention on cuda)")
    return torch.device("cuda")


def test_gpu_runners_are_on_by_default(pair, cuda):
    """On a CUDA device both runners are on unless turned off (passed on an H100,
    2026-11-22)."""
    target, _, _, _ = pair
    llm = specd.LLM(target, target, specd.SpeculationConfig(method="draft", num_speculative_tokens=2),
                    device="cuda", dtype="float32")
    assert llm.target_graph is not None and llm.draft_graph is not None
    off = specd.LLM(target, device="cuda", dtype="float32", target_graph=False)
    assert off.target_graph is None


def test_gpu_kernel_choice_keeps_outputs(pair, cuda):
    """The split, head-grouped attention kernel and clustered draft sampling through both
    runners (captured graphs): speculative greedy outputs equal plain decoding through the
    same kernels, and seeded sampled outputs equal those of one block per row."""
    target, draft, prompts, _ = pair
    both = specd.KernelChoice(grouped_attention=True, cluster_rows=True)
    params = greedy_params(len(prompts))
    plain = specd.LLM(target, device="cuda", max_num_batched_tokens=BUDGET, kernels=both)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    llm = make_llm(target, draft, "draft", device="cuda", kernels=both)
    assert llm.target_graph.backend.grouped and llm.draft_graph.backend.grouped
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    sampled = [SamplingParams(temperature=0.8, top_p=0.9, max_tokens=MAX_TOKENS, ignore_eos=True, seed=i)
               for i in range(len(prompts))]
    one_block = make_llm(target, draft, "draft", device="cuda",
                         kernels=specd.KernelChoice(grouped_attention=True, cluster_rows=False))
    assert ([o.token_ids for o in llm.generate(prompts, sampled)]
            == [o.token_ids for o in one_block.generate(prompts, sampled)])


def test_gpu_device_drafts_reach_the_verify_forward_without_host_sync(pair, monkeypatch, cuda):
    """Both runners captured (LLM's default on CUDA): from the draft call to the queued verify
    forward nothing waits for the GPU (torch.cuda.set_sync_debug_mode("error") around the draft
    call and the target forward that copies the device-resident drafts into its inputs), and
    greedy outputs equal plain decoding. Not yet run on a GPU (written 2026-11-27)."""
    target, draft, prompts, _ = pair
    params = greedy_params(len(prompts))
    baseline = [o.token_ids for o in specd.LLM(target, device="cuda", max_num_batched_tokens=BUDGET)
                .generate(prompts, params)]
    llm = make_llm(target, draft, "draft", device="cuda", max_num_seqs=8)  # buckets 1-8: few graphs to capture
    assert llm.engine.device_drafts and llm.draft_graph.capture and llm.target_graph.capture
    llm.draft_graph.capture_all((False,))
    llm.target_graph.capture_all()
    real_draft, real_target, seen = model_runner.run_draft_on_device, model_runner.run_target, []

    def no_sync(fn, *args, **kw):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return fn(*args, **kw)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    def target_call(model, pool, items, trees, graph=None, drafts=None):
        if drafts is None:
            return real_target(model, pool, items, trees, graph=graph)
        seen.append(len(drafts.items))
        return no_sync(real_target, model, pool, items, trees, graph=graph, drafts=drafts)

    monkeypatch.setattr(model_runner, "run_draft_on_device", lambda *a, **kw: no_sync(real_draft, *a, **kw))
    monkeypatch.setattr(model_runner, "run_target", target_call)
    assert [o.token_ids for o in llm.generate(prompts, params)] == baseline
    assert seen


@pytest.mark.parametrize("spec", ["ngram-tree", "draft"])
def test_gpu_graph_replay_equals_eager_forward_without_host_sync(pair, monkeypatch, cuda, spec):
    target, draft, prompts, _ = pair
    params = greedy_params(len(prompts))
    baseline = [o.token_ids for o in specd.LLM(target, device="cuda", max_num_batched_tokens=BUDGET)
                .generate(prompts, params)]
    llm = make_llm(target, draft, spec, device="cuda", target_graph=True)
    graph_runner = llm.target_graph
    assert graph_runner.capture and graph_runner.config.buckets
    eager_runner = TargetGraphRunner(llm.target, llm.pool, TargetGraphConfig(
        max_query=graph_runner.config.max_query, max_blocks=graph_runner.config.max_blocks,
        buckets=graph_runner.config.buckets, capture=False))
    real_run, checked = graph_runner.run, []

    def run(items, trees, drafts=None):  # drafts: a draft-model step's chains kept on the device
        want = eager_runner.run(items, trees, drafts).clone()
        graph_runner._graph(graph_runner.bucket(len(items)), graph_runner.query_len(items, trees))  # capture first
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = real_run(items, trees, drafts)  # fill + replay: no host sync allowed
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        checked.append((len(items), graph_runner.query_len(items, trees)))
        return got

    monkeypatch.setattr(graph_runner, "run", run)
    assert [o.token_ids for o in llm.generate(prompts, params)] == baseline
    assert checked
    if spec == "ngram-tree":
        assert len({q for _, q in checked}) > 1  # several (bucket, q) graphs replayed
