"""Logprobs of generated tokens (SamplingParams.logprobs, engine/logprobs.py): the gather
against log_softmax on random rows (ranks, ties, top lists, 16-bit rows); through the engine,
speculative outputs carry the logprobs plain decoding gives (every proposer, chains and
trees), which are the target's raw log-softmax at each position (HF transformers, teacher
forced), for greedy and sampled requests; stop cuts, streams, mixed batches and bad values."""

import numpy as np
import pytest
import torch

import specd
from specd.engine import step_logprobs as step_module
from specd.engine.logprobs import Logprob, RowRequest, gather_logprobs
from specd.errors import InvalidArgumentError
from test_engine import self_draft
from tiny_models import CODE_SNIPPET, load_hf_model

TOL = 1e-4
TOP = 4


def _reference(row: torch.Tensor, token: int, top: int) -> dict[int, Logprob]:
    """Brute force: log_softmax, rank = 1 + tokens strictly above, the top by (value, id)."""
    lp = torch.log_softmax(row.double(), dim=-1)
    order = sorted(range(row.numel()), key=lambda t: (-float(row[t]), t))[:top] + [token]
    return {t: Logprob(float(lp[t]), 1 + int((row > row[t]).sum())) for t in order}


def _assert_close(got: dict[int, Logprob], want: dict[int, Logprob], tol: float = TOL) -> None:
    assert set(got) == set(want)
    for t in want:
        assert got[t].rank == want[t].rank, (t, got[t], want[t])
        assert abs(got[t].logprob - want[t].logprob) <= tol, (t, got[t], want[t])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_equals_log_softmax_with_ranks_and_ties(dtype):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(12, 50, generator=gen) * 3).to(dtype)
    logits[3, [5, 9, 17]] = logits[3].max() + 1  # a three-way tie at the top
    logits[4, 7] = logits[4, 8] = logits[4, 11]   # a tie below the top
    asks = [RowRequest(np.array([3, 3, 0]), np.array([9, 2, 40]), TOP),
            RowRequest(np.array([4, 11]), np.array([7, 8]), 0),
            RowRequest(np.array([], dtype=np.int64), np.array([], dtype=np.int64), 2),
            RowRequest(np.array([4]), np.array([int(logits[4].float().argmin())]), 20)]
    got = gather_logprobs(logits, asks)
    assert [len(g) for g in got] == [3, 2, 0, 1]
    for ask, per_row in zip(asks, got):
        for row, token, entry in zip(ask.rows, ask.tokens, per_row):
            _assert_close(entry, _reference(logits[row].float(), int(token), ask.top), 1e-5)
    assert got[0][0][9].rank == got[0][0][5].rank == got[0][0][17].rank == 1  # tied tops share rank 1
    assert got[3][0][int(logits[4].float().argmin())].rank == 50 - int((logits[4] == logits[4].min()).sum()) + 1


def test_gather_refuses_rows_outside_the_logits():
    with pytest.raises(InvalidArgumentError, match="logprob rows/tokens out of range"):
        gather_logprobs(torch.zeros(3, 10), [RowRequest(np.array([3]), np.array([0]), 1)])
    with pytest.raises(InvalidArgumentError, match="out of range"):
        gather_logprobs(torch.zeros(3, 10), [RowRequest(np.array([0]), np.array([10]), 1)])


@pytest.mark.parametrize("bad", [-1, 21, 1.5, True, "3"])
def test_bad_logprobs_are_refused_by_name(bad):
    with pytest.raises(InvalidArgumentError, match="logprobs must be None or an int in \\[0, 20\\]"):
        specd.SamplingParams(logprobs=bad)


# ---- through the engine ----

@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_llama_dir):
    draft = self_draft(tiny_llama_dir, tmp_path_factory.mktemp("logprobs_self_draft"))
    plain = specd.LLM(tiny_llama_dir)
    tok = plain.tokenizer
    prompts = [tok(t)["input_ids"] for t in (CODE_SNIPPET[:80], "for i in range(10):\n    print(i)\n" * 2,
                                             "def f(a, b):", CODE_SNIPPET)]
    return tiny_llama_dir, draft, plain, prompts


def _greedy(**kw):
    return specd.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=TOP, **kw)


def _teacher_forced(hf, prompt: list[int], output: list[int]) -> torch.Tensor:
    """HF's log_softmax of the rows that predicted each output token ``[len(output), vocab]``."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + output])).logits[0].double()
    return torch.log_softmax(logits[len(prompt) - 1:len(prompt) + len(output) - 1], dim=-1)


def _check_against_hf(hf, prompt, out, top: int) -> None:
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
    rows = _teacher_forced(hf, prompt, out.token_ids)
    for j, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        assert token in entry
        assert len(entry) in (top, top + 1)
        for t, lp in entry.items():
            assert abs(lp.logprob - float(rows[j, t])) <= TOL, (j, t, lp, float(rows[j, t]))
            assert lp.rank == 1 + int((rows[j] > rows[j, t] + 1e-6).sum()), (j, t, lp)
        best = sorted(entry.items(), key=lambda kv: kv[1].rank)[:top]
        assert [lp.rank for _, lp in best] == sorted(lp.rank for _, lp in best)
    assert out.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs)))


def test_plain_greedy_logprobs_are_the_targets_log_softmax(setup):
    target, _, plain, prompts = setup
    hf = load_hf_model(target)
    for prompt, out in zip(prompts, plain.generate(prompts, _greedy())):
        _check_against_hf(hf, prompt, out, TOP)
        assert all(e[t].rank == 1 for t, e in zip(out.token_ids, out.logprobs))  # greedy: the argmax


@pytest.mark.parametrize("method,kw", [("ngram", {}), ("suffix", {}), ("draft", {}),
                                       ("draft", {"draft_tree_width": 2, "max_tree_nodes": 6})])
def test_speculative_logprobs_equal_plain_decodings(setup, method, kw):
    target, draft, plain, prompts = setup
    want = plain.generate(prompts, _greedy())
    llm = specd.LLM(target, draft if method == "draft" else None,
                    specd.SpeculationConfig(method=method, num_speculative_tokens=4, **kw))
    got = llm.generate(prompts, _greedy())
    assert llm.metrics()["acceptance_rate"] > 0  # steps emitted several tokens (rows past the root)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        for eg, ew in zip(g.logprobs, w.logprobs):
            _assert_close(eg, ew)
        assert g.cumulative_logprob == pytest.approx(w.cumulative_logprob, abs=1e-3)


def test_sampled_logprobs_are_raw_whatever_the_path(setup):
    """Temperature, top-k and top-p change which tokens come, not the logprobs reported for
    them: the target's raw log-softmax (with a draft model's chains, rejections included)."""
    target, draft, _, prompts = setup
    hf = load_hf_model(target)
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=3))
    params = [specd.SamplingParams(temperature=t, top_k=k, top_p=p, max_tokens=20, ignore_eos=True, seed=s,
                                   logprobs=2)
              for s, (t, k, p) in enumerate([(0.8, 0, 1.0), (1.3, 20, 1.0), (0.6, 0, 0.7), (1.0, 0, 1.0)])]
    outs = llm.generate(prompts, params)
    m = llm.metrics()
    assert 0 < m["acceptance_rate"] < 1  # accepted and rejected drafts (recovered tokens)
    for prompt, out in zip(prompts, outs):
        _check_against_hf(hf, prompt, out, 2)


def test_logprobs_follow_stop_cuts_and_streams(setup):
    target, draft, plain, prompts = setup
    base = plain.generate(prompts[:1], _greedy())[0]
    stop_at = base.token_ids[5]
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=4))
    # A stop token inside an accepted run: the tokens after it are dropped with their logprobs.
    cut = llm.generate(prompts[:1], _greedy(stop_token_ids=[stop_at]))[0]
    n = base.token_ids.index(stop_at) + 1
    assert cut.token_ids == base.token_ids[:n] and len(cut.logprobs) == n
    for a, b in zip(cut.logprobs, base.logprobs):
        _assert_close(a, b)
    # Streams: the chunks' logprobs, in order, are the output's.
    chunks = list(llm.stream(prompts[1], _greedy()))
    streamed = [e for c in chunks for e in c.logprobs]
    whole = llm.generate([prompts[1]], _greedy())[0]
    assert [c for ch in chunks for c in ch.token_ids] == whole.token_ids
    assert len(streamed) == len(whole.logprobs)
    for a, b in zip(streamed, whole.logprobs):
        _assert_close(a, b, 1e-6)
        assert all(lp.decoded_token is not None for lp in a.values())
    # The serving path (add_request / step) too.
    rid = llm.add_request(prompts[2], _greedy())
    served = []
    while llm.has_unfinished_requests():
        served += [e for c in llm.step() if c.request_id == rid for e in c.logprobs]
    again = llm.generate([prompts[2]], _greedy())[0]
    assert len(served) == len(again.logprobs)
    for a, b in zip(served, again.logprobs):
        _assert_close(a, b, 1e-6)


def test_mixed_batch_gets_logprobs_only_where_asked(setup, monkeypatch):
    target, draft, _, prompts = setup
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=3))
    calls = []
    real = step_module.gather_logprobs
    monkeypatch.setattr(step_module, "gather_logprobs", lambda *a: calls.append(1) or real(*a))
    params = [specd.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=n) for n in (None, 0, 5)]
    outs = llm.generate(prompts[:3], params)
    assert outs[0].logprobs is None and outs[0].cumulative_logprob is None
    assert all(len(e) == 1 for e in outs[1].logprobs)  # the chosen token only
    assert all(len(e) in (5, 6) for e in outs[2].logprobs)
    steps_with_logprobs = len(calls)
    assert 0 < steps_with_logprobs <= llm.engine.steps  # one gather per step at most
    calls.clear()
    llm.generate(prompts[:2], params[0])
    assert calls == []  # no request asked: nothing gathered, no extra read


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 0.1)])
def test_gpu_logprobs_through_the_graph_runners_equal_the_cpus(setup, dtype, tol):
    """On CUDA (draft and target graph runners, drafts kept on the device, logits in the
    model's dtype): greedy outputs and their logprobs as the float32 CPU engine gives them
    (bf16: ranks and top ids may differ where logits are close, so only the chosen tokens'
    logprobs are compared, within the tolerance)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    target, draft, plain, prompts = setup
    want = plain.generate(prompts, _greedy())
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=4), dtype=dtype,
                    device="cuda")
    got = llm.generate(prompts, _greedy())
    for g, w in zip(got, want):
        n = next((i for i, (a, b) in enumerate(zip(g.token_ids, w.token_ids)) if a != b), len(w.token_ids))
        if dtype == "float32":
            assert n == len(w.token_ids)
        for eg, ew, token in zip(g.logprobs[:n], w.logprobs[:n], w.token_ids[:n]):
            if dtype == "float32":
                _assert_close(eg, ew, tol)
            else:
                assert abs(eg[token].logprob - ew[token].logprob) <= tol


# ---- prompt logprobs ----

def _check_prompt_against_hf(hf, prompt: list[int], got, top: int) -> None:
    with torch.no_grad():
        rows = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].double(), dim=-1)
    assert got[0] is None and len(got) == len(prompt)
    for j in range(1, len(prompt)):
        entry = got[j]
        assert prompt[j] in entry and len(entry) in (top, top + 1)
        for t, lp in entry.items():
            assert abs(lp.logprob - float(rows[j - 1, t])) <= TOL, (j, t, lp)
            assert lp.rank == 1 + int((rows[j - 1] > rows[j - 1, t] + 1e-6).sum()), (j, t, lp)
        assert all(lp.decoded_token is not None for lp in entry.values())


@pytest.mark.parametrize("case", ["one forward", "chunked prefill", "speculation", "preemption"])
def test_prompt_logprobs_are_the_targets_log_softmax(setup, case):
    """Whatever the prefill's chunks (7 tokens per step), speculation or a preemption
    (prefill recomputed: nothing recorded twice), every prompt token after the first gets the
    target's log-softmax of the row before it; requests without prompt_logprobs in the same
    batch, and the generated tokens, are unchanged."""
    target, draft, plain, prompts = setup
    hf = load_hf_model(target)
    kw = {"one forward": {}, "chunked prefill": dict(max_num_batched_tokens=7)}.get(case, {})
    spec = None
    if case in ("speculation", "preemption"):
        spec = specd.SpeculationConfig(method="draft", num_speculative_tokens=3)
    batch = prompts
    if case == "preemption":
        batch = [p[:12 + 9 * i] for i, p in enumerate(prompts * 2)]
        probe = specd.LLM(target, draft, spec, block_size=4)
        one = sum(probe.pool.blocks.pages_for_tokens(60 + 40 + 4, model=m) for m in (0, 1))
        kw = dict(num_kv_pages=one + 6, block_size=4)
    llm = specd.LLM(target, draft if spec else None, spec, **kw)
    asked = [specd.SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                                  prompt_logprobs=None if i % 3 == 1 else i % 3 + 1) for i in range(len(batch))]
    outs = llm.generate(batch, asked)
    if case == "preemption":
        assert sum(o.metrics.preemptions for o in outs) > 0, "the pool was not small enough to preempt"
    want = plain.generate(batch, specd.SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    for prompt, out, w, params in zip(batch, outs, want, asked):
        assert out.token_ids == w.token_ids
        if params.prompt_logprobs is None:
            assert out.prompt_logprobs is None
        else:
            _check_prompt_against_hf(hf, prompt, out.prompt_logprobs, params.prompt_logprobs)


def test_a_one_token_prompt_has_one_empty_entry(setup):
    target, _, plain, _ = setup
    out = plain.generate([[17]], specd.SamplingParams(max_tokens=2, prompt_logprobs=3))[0]
    assert out.prompt_logprobs == [None]
    with pytest.raises(InvalidArgumentError, match="prompt_logprobs must be None or an int in \\[0, 20\\]"):
        specd.SamplingParams(prompt_logprobs=21)
