"""Logits processors (SamplingParams min_tokens, logit_bias, repetition / presence /
frequency penalties; engine/logits_processors.py): the rows against a per-node reference on
random trees; greedy decoding against HF transformers' processors and a reference loop, with
and without speculation (n-gram, suffix, draft chains and trees); sampled speculation against
the processed joint distribution of two tokens (chi-square), where the second comes from a
row whose penalties count the draft above it; logprobs stay raw; bad values."""

from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats

import specd
from specd.engine.logits_processors import LogitsProcessors, PenaltyState
from specd.engine.request import Request
from specd.errors import InvalidArgumentError
from test_logprobs import _check_against_hf, setup  # noqa: F401 (setup: a fixture)
from tiny_models import load_hf_model

EOS = 0


def reference_row(raw: np.ndarray, prompt: list[int], output: list[int], p: specd.SamplingParams,
                  eos: set[int]) -> np.ndarray:
    """The processed row, written out per token (the module's rules, independently)."""
    row = raw.astype(np.float64).copy()
    if len(output) < p.min_tokens:
        for t in set(p.stop_token_ids) | (set() if p.ignore_eos else eos):
            if t < row.size:
                row[t] = -np.inf
    for t, b in (p.logit_bias or {}).items():
        row[t] += b
    if p.repetition_penalty != 1:
        for t in set(prompt) | set(output):
            row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
    for t, c in Counter(output).items():
        row[t] -= p.frequency_penalty * c + p.presence_penalty
    return row


def _request(rid: int, prompt: list[int], output: list[int], params: specd.SamplingParams) -> Request:
    return Request(rid, None, list(prompt), params, rng_seed=0, rng_request=rid, max_len=10_000,
                   eos_ids=frozenset({EOS}), output_ids=list(output))


PARAMS = [
    specd.SamplingParams(max_tokens=50, repetition_penalty=1.7, presence_penalty=0.5, frequency_penalty=0.8),
    specd.SamplingParams(max_tokens=50, min_tokens=6, stop_token_ids=[3, 999], logit_bias={4: 5.0, 9: -2.5}),
    specd.SamplingParams(max_tokens=50, min_tokens=4, ignore_eos=True, stop_token_ids=[2], repetition_penalty=0.6),
    specd.SamplingParams(max_tokens=50),  # not processed: its rows stay as they are
    specd.SamplingParams(max_tokens=50, min_tokens=3, logit_bias={1: 1.0}, presence_penalty=-1.5,
                         frequency_penalty=2.0, repetition_penalty=1.2),
]


@pytest.mark.parametrize("all_columns", [False, True], ids=["changeable columns", "all columns"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_equal_the_per_node_reference(dtype, all_columns):
    """Both ways of processing the penalised rows: the CPU's (the columns a penalty can
    change) and the GPU's (every column)."""
    rng = np.random.default_rng(0)
    vocab = 40
    reqs, trees, starts, row = [], [], [], 0
    for i, params in enumerate(PARAMS):
        prompt = rng.integers(0, vocab, size=rng.integers(1, 12)).tolist()
        output = rng.integers(0, vocab, size=rng.integers(0, 6)).tolist()
        n = int(rng.integers(1, 9))
        parents = [-1] + [int(rng.integers(0, j)) for j in range(1, n)]  # branches, depths up to n - 1
        tokens = [0] + rng.integers(0, 12, size=n - 1).tolist()  # small ids: repeats along paths
        reqs.append(_request(i, prompt, output, params))
        trees.append(specd.TokenTree.from_parents(np.array(tokens, np.int32), np.array(parents, np.int32)))
        starts.append(row)
        row += n
    raw = (torch.randn(row, vocab, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    logits = raw.clone()
    assert LogitsProcessors(all_columns).apply(logits, reqs, trees, starts)
    for req, tree, start in zip(reqs, trees, starts):
        parents, tokens = np.asarray(tree.parents), np.asarray(tree.tokens)
        for node in range(len(tree)):
            path, at = [], node
            while at > 0:
                path.insert(0, int(tokens[at]))
                at = parents[at]
            want = reference_row(raw[start + node].double().numpy(), req.prompt_ids, req.output_ids + path,
                                 req.params, {EOS})
            got = logits[start + node].double().numpy()
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"request {req.id} node {node}")
    assert torch.equal(logits[starts[3]:starts[4]], raw[starts[3]:starts[4]])
    plain = raw.clone()
    assert not LogitsProcessors(all_columns).apply(plain, reqs[3:4], trees[3:4], starts[3:4])
    assert torch.equal(plain, raw)


def test_penalty_state_follows_outputs_across_steps_and_reuses_slots():
    vocab = 30
    rng = np.random.default_rng(3)
    state = PenaltyState(vocab, torch.device("cpu"))
    params = specd.SamplingParams(max_tokens=50, frequency_penalty=1.0)
    reqs = {i: _request(i, rng.integers(0, vocab, 5).tolist(), [], params) for i in range(6)}
    live = [0, 1, 2, 3, 4]
    for step in range(12):
        for i in live:
            reqs[i].output_ids.extend(rng.integers(0, vocab, int(rng.integers(0, 4))).tolist())
        slots = state.sync([reqs[i] for i in live])
        assert len(set(slots)) == len(live)
        for i, slot in zip(live, slots):
            out, prompt = reqs[i].output_ids, reqs[i].prompt_ids
            assert state.counts[slot].tolist() == np.bincount(out, minlength=vocab).tolist(), (step, i)
            assert state.seen[slot].tolist() == [t in set(out) | set(prompt) for t in range(vocab)], (step, i)
        if step == 4:  # one ends; a new one takes its row, cleared
            state.release(live.pop(1))
            live.append(5)
        if step == 7:
            state.release(live.pop(0))
    assert state.counts.shape[0] == 8  # grew once (4 -> 8 rows), rows reused after


# ---- greedy through the engine ----

# ``setup`` (the fixture of test_logprobs.py, imported): target, self-draft, plain LLM, prompts

def _hf_greedy(hf, prompt, max_tokens, **kw):
    hf.generation_config.eos_token_id = None if "min_new_tokens" not in kw else EOS
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=EOS, **kw)
    return out[0, len(prompt):].tolist()


def _reference_greedy(hf, prompt, params: specd.SamplingParams) -> list[int]:
    """Plain greedy decoding with the processors applied by reference_row to HF's logits."""
    out = []
    with torch.no_grad():
        for _ in range(params.max_tokens):
            raw = hf(torch.tensor([prompt + out])).logits[0, -1].double().numpy()
            out.append(int(np.argmax(reference_row(raw, prompt, out, params, {EOS}))))
    return out


SPECS = {"ngram": dict(method="ngram"), "suffix": dict(method="suffix"), "draft": dict(method="draft"),
         "draft tree": dict(method="draft", draft_tree_width=2, max_tree_nodes=6)}


def _speculative(setup, spec: str):
    target, draft, _, _ = setup
    kw = SPECS[spec]
    return specd.LLM(target, draft if kw["method"] == "draft" else None,
                     specd.SpeculationConfig(num_speculative_tokens=4, **kw))


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_greedy_processed_speculation_equals_hf_and_plain(setup, spec):
    target, _, plain, prompts = setup
    hf = load_hf_model(target)
    cases = [(dict(repetition_penalty=1.4), dict(repetition_penalty=1.4)),
             (dict(logit_bias={5: 6.0, 15: 3.0, 265: -50.0}), dict(sequence_bias={(5,): 6.0, (15,): 3.0, (265,): -50.0})),
             (dict(min_tokens=18, logit_bias={EOS: 9.0}), dict(min_new_tokens=18, sequence_bias={(EOS,): 9.0}))]
    llm = _speculative(setup, spec)
    llm.engine.processors.all_columns = spec == "draft"  # the GPU's way too, on one proposer
    accepted = 0
    for ours, theirs in cases:
        params = specd.SamplingParams(temperature=0.0, max_tokens=20, ignore_eos="min_tokens" not in ours, **ours)
        want = [o.token_ids for o in plain.generate(prompts, params)]
        got = [o.token_ids for o in llm.generate(prompts, params)]
        assert got == want, ours
        accepted += llm.metrics()["acceptance_rate"] > 0
        for prompt, tokens in zip(prompts[:2], want):
            assert tokens == _hf_greedy(hf, prompt, len(tokens), **theirs)[:len(tokens)], ours
        if "min_tokens" in ours:  # EOS favoured, held back for 18 tokens, then it ends the output
            assert all(len(t) == 19 and t[-1] == EOS and EOS not in t[:-1] for t in want)
    assert accepted  # speculation ran (drafts accepted) in at least one case


@pytest.mark.parametrize("spec", sorted(SPECS))
@pytest.mark.parametrize("penalties", ["discouraging", "encouraging"])
def test_greedy_penalties_equal_the_reference_loop(setup, spec, penalties):
    """Positive penalties (no repeats) and a negative frequency penalty (repeats, where the
    counts' exact values decide)."""
    target, _, plain, prompts = setup
    hf = load_hf_model(target)
    kw = (dict(presence_penalty=0.4, frequency_penalty=0.9, repetition_penalty=1.1, logit_bias={15: 2.0})
          if penalties == "discouraging" else dict(presence_penalty=0.3, frequency_penalty=-0.45))
    params = specd.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, **kw)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    assert want[:2] == [_reference_greedy(hf, p, params) for p in prompts[:2]]
    if penalties == "encouraging":
        assert all(len(set(w)) < len(w) - 4 for w in want)
    assert [o.token_ids for o in _speculative(setup, spec).generate(prompts, params)] == want


def test_processed_and_plain_requests_share_a_batch(setup):
    target, _, plain, prompts = setup
    params = [specd.SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, **kw)
              for kw in ({}, {"frequency_penalty": 1.5}, {}, {"logit_bias": {7: 4.0}})]
    want = [plain.generate([p], sp)[0].token_ids for p, sp in zip(prompts, params)]
    llm = _speculative(setup, "draft")
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    assert want[0] == plain.generate([prompts[0]], params[0])[0].token_ids  # unprocessed neighbours unchanged
    assert llm.engine.processors._penalties.slots == {}  # every ended request's row released
    rid = llm.add_request(prompts[1], params[1])
    llm.step()
    llm.step()
    assert list(llm.engine.processors._penalties.slots) == [rid]
    llm.abort_request(rid)
    assert llm.engine.processors._penalties.slots == {}


def test_logprobs_stay_raw_under_processors(setup):
    target, _, _, prompts = setup
    hf = load_hf_model(target)
    params = specd.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2,
                                  logit_bias={5: 20.0}, frequency_penalty=0.3)
    for prompt, out in zip(prompts[:2], _speculative(setup, "ngram").generate(prompts[:2], params)):
        assert out.token_ids.count(5) >= 6  # the bias wins often...
        _check_against_hf(hf, prompt, out, 2)  # ...but the logprobs reported are the raw ones


# ---- sampled: the processed distribution, through depth-1 rows ----

def test_sampled_speculation_follows_the_processed_joint_distribution(setup):
    """Two sampled tokens per request, 3,000 seeds, n-gram speculation on a prompt that repeats
    four favoured tokens (so the n-gram proposer drafts them and the second token often comes
    from the depth-1 row, penalised for the draft above it): their joint distribution equals
    the processed target's (chi-square, alpha = 0.001)."""
    target, _, plain, _ = setup
    favoured = [5, 9, 15, 23]
    prompt = favoured * 6
    kw = dict(logit_bias={t: 12.0 for t in favoured}, frequency_penalty=2.0, presence_penalty=1.0,
              repetition_penalty=1.3)
    n = 3000
    params = [specd.SamplingParams(temperature=1.0, max_tokens=2, ignore_eos=True, seed=s, **kw) for s in range(n)]
    llm = specd.LLM(target, None, specd.SpeculationConfig(method="ngram", num_speculative_tokens=2), max_num_seqs=256)
    outs = llm.generate([prompt] * n, params)
    assert llm.metrics()["acceptance_rate"] > 0.1  # second tokens from depth-1 rows
    hf = load_hf_model(target)
    sp = params[0]
    with torch.no_grad():
        first = reference_row(hf(torch.tensor([prompt])).logits[0, -1].double().numpy(), prompt, [], sp, {EOS})
        p1 = torch.softmax(torch.from_numpy(first), -1).numpy()
        top = np.argsort(-p1)[:8]
        cells, probs = [], []
        for a in top:
            raw = hf(torch.tensor([prompt + [int(a)]])).logits[0, -1].double().numpy()
            p2 = torch.softmax(torch.from_numpy(reference_row(raw, prompt, [int(a)], sp, {EOS})), -1).numpy()
            for b in np.argsort(-p2)[:8]:
                cells.append((int(a), int(b)))
                probs.append(p1[a] * p2[b])
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1)
    for o in outs:
        counts[index.get(tuple(o.token_ids), len(cells))] += 1
    expected = np.append(probs, 1 - sum(probs)) * n
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    assert stats.chisquare(observed, expected).pvalue > 0.001
    pairs = Counter(tuple(o.token_ids) for o in outs)
    assert sum(c for (a, b), c in pairs.items() if a == b) < 0.2 * n  # the penalties bite on repeats


# ---- bad values ----

@pytest.mark.parametrize("field,value", [("min_tokens", -1), ("min_tokens", 17), ("min_tokens", 2.0),
                                         ("logit_bias", {-1: 1.0}), ("logit_bias", {3: 101.0}),
                                         ("logit_bias", {3: float("nan")}), ("logit_bias", [(3, 1.0)]),
                                         ("repetition_penalty", 0.0), ("repetition_penalty", float("inf")),
                                         ("presence_penalty", 2.5), ("frequency_penalty", -3.0),
                                         ("frequency_penalty", "1")])
def test_bad_values_are_refused_by_name(field, value):
    with pytest.raises(InvalidArgumentError, match=f"^{field} must be"):
        specd.SamplingParams(max_tokens=16, **{field: value})


def test_logit_bias_outside_the_vocabulary_is_refused(setup):
    _, _, plain, prompts = setup
    vocab = plain.target.config.vocab_size
    with pytest.raises(InvalidArgumentError, match=f"logit_bias has token id {vocab}, outside the vocabulary"):
        plain.generate(prompts[0], specd.SamplingParams(logit_bias={vocab: 1.0}))


def test_gpu_processed_speculation_equals_the_cpu(setup):
    """On CUDA (graph runners; penalised draft chains read to the host before verification)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    target, draft, plain, prompts = setup
    params = specd.SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, presence_penalty=0.4,
                                  frequency_penalty=0.9, repetition_penalty=1.1, logit_bias={15: 2.0}, min_tokens=3)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=4),
                    dtype="float32", device="cuda")
    assert [o.token_ids for o in llm.generate(prompts, params)] == want


@pytest.mark.parametrize("method", ["draft+suffix", "draft"])
def test_processors_and_logprobs_survive_preemption_and_chunked_prefill(setup, method):
    """A pool too small for the batch (requests preempted and recomputed), 16 tokens per step
    (prompts prefilled in chunks), random processors and logprobs per request, the goodput
    policy choosing k and proposer: every output, and its logprobs, equal plain decoding's,
    and every KV page and penalty row is released at the end."""
    target, draft, plain, prompts = setup
    rng = np.random.default_rng(5)
    params = []
    for i in range(8):
        kw = {}
        if rng.random() < 0.7:
            kw.update(presence_penalty=float(rng.uniform(-0.5, 1)), frequency_penalty=float(rng.uniform(-0.5, 1)))
        if rng.random() < 0.5:
            kw.update(repetition_penalty=float(rng.uniform(0.8, 1.5)))
        if rng.random() < 0.5:
            kw.update(logit_bias={int(t): float(rng.uniform(-3, 3)) for t in rng.integers(0, 300, 3)})
        if rng.random() < 0.5:
            kw.update(min_tokens=int(rng.integers(1, 30)))
        params.append(specd.SamplingParams(temperature=0.0, max_tokens=30, logprobs=int(rng.integers(0, 3)), **kw))
    batch = [prompts[i % len(prompts)][: 3 + 11 * i] for i in range(8)]
    want = [plain.generate([p], sp)[0] for p, sp in zip(batch, params)]
    probe = specd.LLM(target, draft, specd.SpeculationConfig(method=method, num_speculative_tokens="auto"), block_size=4)
    one = sum(probe.pool.blocks.pages_for_tokens(80 + 30 + 9, model=m) for m in (0, 1))
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method=method, num_speculative_tokens="auto"),
                    num_kv_pages=one + 8, block_size=4, max_num_batched_tokens=16)
    outs = llm.generate(batch, params)
    assert sum(o.metrics.preemptions for o in outs) > 0, "the pool was not small enough to preempt"
    for got, w in zip(outs, want):
        assert got.token_ids == w.token_ids and got.finish_reason == w.finish_reason
        for a, b in zip(got.logprobs, w.logprobs):
            assert set(a) == set(b) and all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in a)
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages
    assert llm.engine.processors._penalties is None or llm.engine.processors._penalties.slots == {}
