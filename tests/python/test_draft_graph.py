"""The graph-capturable draft step loop (specd.engine.draft_graph): the draft's row sampling
(the sampling kernel's rule) equals the references; with ``LLM(..., draft_graph=True)`` the engine's greedy outputs
equal plain decoding and every draft call proposes what the plain draft loop proposes (same
tokens, same distributions), with batch padding and mixed k; GPU: the captured graph replays
what the eager loop computes, with no host synchronisation (skips without a GPU)."""

from dataclasses import replace
from typing import NamedTuple

import numpy as np
import pytest
import torch

import specd
from specd import errors
from specd.engine import model_runner
from specd.engine.draft_graph import DraftGraphConfig, DraftGraphRunner, power_of_two_buckets
from specd.engine.draft_sampling import pack_draft_rows, sample_draft_rows
from specd.engine.params import SamplingParams
from specd.engine.scheduler import DRAFT
from specd.engine.torch_sampling import DRAFT_STREAM
from test_engine import prompts_of_mixed_lengths, self_draft

MAX_TOKENS = 16
ROW_PARAMS = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.3, top_p=0.8),
              SamplingParams(temperature=0.9, top_k=8, top_p=0.9, min_p=0.05), SamplingParams(min_p=0.1),
              SamplingParams(temperature=2.0, top_k=1)]
SEEDS = [0, 5, 2**32 + 7, 2**63 + 11, 2**64 - 1, 123456789, 42]


# ---- the draft's sampling (draft_sampling.py: the sampling kernel's CPU reference here) ----


@pytest.mark.parametrize("seed", range(3))
def test_draft_rows_sample_what_the_references_sample(seed):
    """Each row's distribution is specd.sampling_probs of its parameters and its token is
    specd.sample from it at key (seed, request, DRAFT_STREAM, position); greedy rows: the argmax,
    one-hot. A row with a NaN logit gets token 0 and an all-zero row, the others unaffected."""
    rng = np.random.default_rng(seed)
    logits = torch.from_numpy(rng.standard_normal((len(ROW_PARAMS) + 1, 50)).astype(np.float32) * 3)
    logits[2, 7] = logits[2, 9]  # a tie
    logits[-1, 3] = float("nan")
    params = ROW_PARAMS + [SamplingParams(temperature=1.0)]
    seeds, requests = SEEDS + [9], list(range(len(params)))
    positions = [10 + 3 * r for r in range(len(params))]
    packed, keys = pack_draft_rows(params, seeds, requests, positions, torch.device("cpu"))
    tokens, probs = sample_draft_rows(logits, packed, keys)
    assert tokens.dtype == torch.int64 and probs.dtype == torch.float32
    for r, p in enumerate(ROW_PARAMS):
        want = specd.sampling_probs(logits[r].numpy(), p.temperature, p.top_k, p.top_p, p.min_p)
        np.testing.assert_array_equal(probs[r].numpy(), want)
        want_token = specd.sample(want, seed=seeds[r], request=requests[r], step=DRAFT_STREAM, position=positions[r])
        assert int(tokens[r]) == want_token
        if p.greedy:
            assert int(tokens[r]) == int(torch.argmax(logits[r]))
    assert int(tokens[-1]) == 0 and not probs[-1].any()
    # The same words through the op that samples and the op that gives distributions.
    t2, st = torch.ops.specd.sample_tokens(logits, packed, keys)
    assert torch.equal(t2[:-1].long(), tokens[:-1]) and st.tolist()[-1] != 0


# ---- the engine with the draft graph ----


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory, tiny_llama_dir, tiny_qwen2_dir):
    target = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}[request.param]
    draft = self_draft(target, tmp_path_factory.mktemp(f"graph_draft_{request.param}"))
    plain = specd.LLM(target)
    prompts = prompts_of_mixed_lengths(plain.tokenizer)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    baseline = [o.token_ids for o in plain.generate(prompts, greedy)]
    return target, draft, prompts, baseline


def draft_llm(target, draft, k=4, **kw):
    return specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=k), **kw)


class Call(NamedTuple):
    used: bool          # the runner ran (part of) the draft call
    ks: list            # the distinct k of the batch
    n: int              # requests
    forward0: bool      # the runner ran forward 0 (the catch-up) too
    counts: list        # each request's catch-up length


def checked_run_draft(monkeypatch, calls):
    """Makes every engine draft call run the plain loop first, then the graph runner on the same
    items (KV writes are the same rows with the same values), and compare them: same drafts,
    token for token (greedy and sampled rows), the same distributions, and the same forwards
    reported to the engine's timer (tokens and attended keys of each)."""
    real = model_runner.run_draft

    def recorder(shapes, then=None):
        def on_forward(tokens, fn, keys=None):
            shapes.append((tokens, keys))
            return fn() if then is None else then(tokens, fn, keys)
        return on_forward

    def run(model, pool, items, on_forward=None, graph=None, grammar=None):
        assert graph is not None and grammar is None  # the engine passes its runner (no grammar here)
        want_shapes, got_shapes = [], []
        want, want_q = real(model, pool, items, recorder(want_shapes))
        got, got_q = real(model, pool, items, recorder(got_shapes, on_forward), graph=graph)
        assert got == want
        assert got_shapes == want_shapes
        for g, w in zip(got_q, want_q):
            assert (g is None) == (w is None)
            if g is not None:
                torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
        counts = [it.request.length - it.request.computed[DRAFT] for it in items]
        calls.append(Call(graph.accepts(items), sorted({it.k for it in items}), len(items),
                          graph.accepts(items) and graph.catch_up_width(items) is not None, counts))
        return got, got_q

    monkeypatch.setattr(model_runner, "run_draft", run)


@pytest.mark.parametrize("k", [2, 4])
def test_engine_greedy_with_draft_graph_equals_plain_decoding(pair, monkeypatch, k):
    target, draft, prompts, baseline = pair
    eager = draft_llm(target, draft, k)
    eager_outs = eager.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    llm = draft_llm(target, draft, k, draft_graph=True)
    assert isinstance(llm.draft_graph, DraftGraphRunner) and llm.engine.draft_graph is llm.draft_graph
    calls = []
    checked_run_draft(monkeypatch, calls)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outs] == baseline
    # Same drafts, so the same acceptance as the plain draft loop, request by request.
    assert [o.metrics.accepted_tokens for o in outs] == [o.metrics.accepted_tokens for o in eager_outs]
    assert any(c.used for c in calls)
    assert any(len(c.ks) > 1 for c in calls if c.used)  # mixed k (requests near max_tokens)
    # Forward 0 in the runner, with catch-up lengths that differ within a batch (some requests
    # fully accepted, some rejected early); and forward 0 eager when a catch-up is too long
    # (the first draft call after a prefill).
    assert any(c.forward0 and len(set(c.counts)) > 1 for c in calls)
    assert any(c.used and not c.forward0 for c in calls)


def test_padded_buckets_and_stochastic_rows_propose_what_the_plain_loop_proposes(pair, monkeypatch):
    target, draft, prompts, _ = pair
    llm = draft_llm(target, draft, 4, draft_graph=True, max_num_seqs=5)
    old = llm.draft_graph
    runner = DraftGraphRunner(llm.draft, llm.pool, DraftGraphConfig(max_steps=4, max_blocks=old.config.max_blocks,
                                                                    buckets=(2, 8), capture=False))
    llm.engine.draft_graph = runner
    calls = []
    checked_run_draft(monkeypatch, calls)
    params = [SamplingParams(temperature=0.0 if i % 3 == 0 else 0.8, top_k=(i % 2) * 20, top_p=0.95,
                             max_tokens=MAX_TOKENS, ignore_eos=True, seed=i) for i in range(len(prompts))]
    first = [o.token_ids for o in llm.generate(prompts, params)]
    assert any(c.forward0 and c.n not in (2, 8) for c in calls)  # padded batches ran the whole call
    assert any(c.forward0 and len(set(c.counts)) > 1 for c in calls)
    assert any(c.forward0 and c.n > 2 for c in calls)  # the larger bucket too
    again = draft_llm(target, draft, 4, draft_graph=True, max_num_seqs=5)
    assert [o.token_ids for o in again.generate(prompts, params)] == first  # reproducible


def test_gumbel_draft_draws_match_between_the_runner_and_the_plain_loop(pair, monkeypatch):
    """KernelChoice(draw="gumbel"): the draft's sampled tokens come from the Gumbel-max draw of
    their rows; the graph runner proposes what the plain loop proposes (tokens and rows), and
    the outputs differ from the inverse-CDF draw's for the same seeds (another draw, the same
    distribution: test_engine's statistical test)."""
    target, draft, prompts, _ = pair
    params = [SamplingParams(temperature=0.9, top_p=0.95, max_tokens=MAX_TOKENS, ignore_eos=True, seed=i)
              for i in range(len(prompts))]
    plain = [o.token_ids for o in draft_llm(target, draft, 4, draft_graph=True).generate(prompts, params)]
    llm = draft_llm(target, draft, 4, draft_graph=True, kernels=specd.KernelChoice(draw="gumbel"))
    calls = []
    checked_run_draft(monkeypatch, calls)
    gumbel = [o.token_ids for o in llm.generate(prompts, params)]
    assert any(c.used for c in calls)
    assert gumbel != plain


def test_draft_graph_option_errors(pair):
    target, draft, _, _ = pair
    with pytest.raises(errors.InvalidArgumentError, match="needs a draft model"):
        specd.LLM(target, None, specd.SpeculationConfig(method="ngram"), draft_graph=True)
    with pytest.raises(errors.InvalidArgumentError, match="float32 only"):
        draft_llm(target, draft, 4, dtype="bfloat16", draft_graph=True)
    assert draft_llm(target, draft, 4).draft_graph is None  # off by default
    assert power_of_two_buckets(24) == (1, 2, 4, 8, 16, 24) and power_of_two_buckets(1) == (1,)


def test_forward0_eager_config_and_k1_equal_plain_decoding(pair, monkeypatch):
    """max_catch_up=0 keeps forward 0 eager (the runner runs forwards 1..k-1 only); with k = 1
    the runner's whole call is forward 0."""
    target, draft, prompts, baseline = pair
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    calls = []
    checked_run_draft(monkeypatch, calls)
    llm = draft_llm(target, draft, 3, draft_graph=True)
    old = llm.draft_graph
    llm.engine.draft_graph = DraftGraphRunner(llm.draft, llm.pool, DraftGraphConfig(
        max_steps=3, max_blocks=old.config.max_blocks, buckets=(), max_catch_up=0))
    assert [o.token_ids for o in llm.generate(prompts[:4], greedy)] == baseline[:4]
    assert any(c.used for c in calls) and not any(c.forward0 for c in calls)
    calls.clear()
    llm = draft_llm(target, draft, 1, draft_graph=True)
    assert [o.token_ids for o in llm.generate(prompts[:4], greedy)] == baseline[:4]
    assert any(c.forward0 for c in calls)


# ---- GPU ----


@pytest.fixture
def cuda():
    import specd.ops as ops

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not ops.HAS_CUDA_KERNELS:
        pytest.skip("specd built without CUDA kernels")
    return torch.device("cuda")


@pytest.mark.parametrize("per_forward,draw", [(True, "inverse_cdf"), (False, "inverse_cdf"), (True, "gumbel")],
                         ids=["graph_per_forward", "one_graph", "graph_per_forward_gumbel"])
def test_gpu_graph_replay_equals_eager_loop_without_host_sync(pair, monkeypatch, cuda, per_forward, draw):
    """The captured graphs (a graph per forward, the default, or one for the whole call; forward
    0 included when the catch-up fits, else forwards 1..k-1) replay what the runner's eager code
    computes, and a run (inputs filled and uploaded, graphs replayed) does not synchronise with
    the host; also with the draft's Gumbel-max draw (KernelChoice(draw="gumbel"))."""
    target, draft, prompts, _ = pair
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    baseline = [o.token_ids for o in specd.LLM(target, device="cuda").generate(prompts, greedy)]
    llm = draft_llm(target, draft, 4, device="cuda", draft_graph=True, kernels=specd.KernelChoice(draw=draw))
    assert llm.draft_graph.config.graph_per_forward  # the default
    graph_runner = DraftGraphRunner(llm.draft, llm.pool, replace(llm.draft_graph.config,
                                                                 graph_per_forward=per_forward))
    llm.engine.draft_graph = graph_runner
    eager_runner = DraftGraphRunner(llm.draft, llm.pool, DraftGraphConfig(
        max_steps=4, max_blocks=graph_runner.config.max_blocks, buckets=graph_runner.config.buckets, capture=False))
    real_run, checked = graph_runner.run, []

    def run(items, first_tokens=None, on_forward=None):
        want, want_q, want_t = (t.clone() if t is not None else None for t in eager_runner.run(items, first_tokens))
        sampling = any(not it.request.params.greedy for it in items)
        width = 0 if first_tokens is not None else graph_runner.catch_up_width(items)
        graph_runner._graphs_for(graph_runner.bucket(len(items)), width, max(it.k for it in items), sampling)  # capture
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got, got_q, got_t = real_run(items, first_tokens, on_forward)  # fill + replay: no host sync allowed
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert torch.equal(got, want)
        if want_q is not None:
            assert torch.equal(got_q, want_q) and torch.equal(got_t, want_t)
        counts = {it.request.length - it.request.computed[DRAFT] for it in items}
        checked.append((len(items), width, len(counts)))
        return got, got_q, got_t

    monkeypatch.setattr(graph_runner, "run", run)
    assert [o.token_ids for o in llm.generate(prompts, greedy)] == baseline
    sampled = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=MAX_TOKENS, ignore_eos=True, seed=3)
    llm.generate(prompts, sampled)
    assert any(width == 0 for _, width, _ in checked)  # forward 0 eager (after a prefill)
    assert any(width > 0 and distinct > 1 for _, width, distinct in checked)  # forward 0 in the graph
