"""The engine end to end on tiny random Llama and Qwen2 models (target + smaller draft, same
tokenizer): greedy losslessness against plain decoding and HF transformers, every method and
k, trees, preemption, chunked prefill, KV accounting, stochastic reproducibility and
distribution, streaming, stop conditions and errors."""

import numpy as np
import pytest
import torch
from scipy import stats

import specd
from specd import errors
from tiny_models import CODE_SNIPPET, EOS_TOKEN_ID, load_hf_model, make_tiny_model

MAX_TOKENS = 20


def prompts_of_mixed_lengths(tokenizer):
    """8 prompts from 3 to ~60 tokens, some repeating themselves (prompt lookup can hit)."""
    base = CODE_SNIPPET
    texts = ["x", "def f(a, b):", base[:40], base, base + base[:30], "for i in range(10):\n    print(i)\n" * 2,
             "import os\nimport sys\n", "return n if n < 2 else"]
    return [tokenizer(t)["input_ids"] for t in texts]


def greedy(max_tokens=MAX_TOKENS, **kw):
    return specd.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def make_llm(target, draft=None, method="none", k=3, **kw):
    spec = specd.SpeculationConfig(method=method, num_speculative_tokens=k, **kw.pop("spec", {}))
    return specd.LLM(target, draft if method == "draft" else None, spec, **kw)


def self_draft(target_dir, out_dir):
    """A correlated draft, like a real small model of the same family: the target's first layer
    with its embeddings, final norm and LM head (half the target's KV per token)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(target_dir))
    hf.model.layers = hf.model.layers[:1]
    hf.config.num_hidden_layers = 1
    if hasattr(hf.config, "layer_types") and hf.config.layer_types:
        hf.config.layer_types = hf.config.layer_types[:1]
    hf.save_pretrained(str(out_dir))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (target_dir / name).exists():
            (out_dir / name).write_bytes((target_dir / name).read_bytes())
    return out_dir


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def models(request, tmp_path_factory, tiny_llama_dir, tiny_qwen2_dir):
    target = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}[request.param]
    draft = self_draft(target, tmp_path_factory.mktemp(f"self_draft_{request.param}"))
    plain = make_llm(target)
    prompts = prompts_of_mixed_lengths(plain.tokenizer)
    baseline = [o.token_ids for o in plain.generate(prompts, greedy())]
    return request.param, target, draft, prompts, baseline


def test_plain_greedy_matches_hf_generate(models):
    _, target, _, prompts, baseline = models
    hf = load_hf_model(target)
    hf.generation_config.eos_token_id = None  # like ignore_eos (min_new_tokens would mask EOS instead)
    for ids, ours in zip(prompts, baseline):
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                              pad_token_id=EOS_TOKEN_ID)
        assert out[0, len(ids):].tolist() == ours


@pytest.mark.parametrize("method", ["ngram", "suffix", "draft"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_speculation_is_lossless(models, method, k):
    _, target, draft, prompts, baseline = models
    llm = make_llm(target, draft, method, k)
    outs = llm.generate(prompts, greedy())
    assert [o.token_ids for o in outs] == baseline
    drafted = sum(o.metrics.draft_tokens for o in outs)
    accepted = sum(o.metrics.accepted_tokens for o in outs)
    assert drafted > 0 and accepted > 0, "speculation did not happen"
    for o in outs:
        m = o.metrics
        assert m.generated_tokens == MAX_TOKENS
        assert m.verify_steps == MAX_TOKENS - m.accepted_tokens  # each step emits accepted + 1
        assert sum(m.accepted_per_position) == m.accepted_tokens
        assert m.mean_accepted_length >= 1.0
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages  # everything freed


def test_token_trees_are_lossless(models):
    _, target, _, prompts, baseline = models
    spec = dict(ngram_candidates=3, ngram_max=2)
    chains = make_llm(target, method="ngram", k=4, spec=dict(spec, ngram_candidates=1)).generate(prompts, greedy())
    trees = make_llm(target, method="ngram", k=4, spec=dict(spec, max_tree_nodes=10)).generate(prompts, greedy())
    assert [o.token_ids for o in trees] == baseline
    # Several candidate continuations per step: trees drafted more nodes than chains did.
    assert sum(o.metrics.draft_tokens for o in trees) > sum(o.metrics.draft_tokens for o in chains)


@pytest.mark.parametrize("width,k,nodes", [(2, 3, None), (3, 4, 5), (2, 8, None)])
def test_draft_model_trees_are_lossless(models, width, k, nodes):
    """The draft model grows token trees (draft_tree_width > 1): greedy outputs equal plain
    decoding, the trees branch, every step's tree stays within its node budget, and the
    KV pages match the committed lengths after every step (the accepted path's draft KV is
    kept, the rest of the tree's dropped)."""
    _, target, draft, prompts, baseline = models
    spec = dict(draft_tree_width=width, max_tree_nodes=nodes)
    llm = make_llm(target, draft, "draft", k, block_size=4, spec=spec)
    requests = llm._requests(prompts, greedy())
    for r in requests:
        llm.engine.add(r)
    shapes = []
    propose = llm.engine._propose

    def spy(items, *args):
        trees, dists, seconds = propose(items, *args)
        assert not dists  # deterministic candidates: verified one-hot
        for it in items:
            if it.k > 0:
                tree = trees[it.request.id]
                shapes.append((tree.num_drafts, tree.max_depth, tree.is_chain, it.nodes, it.k))
        return trees, dists, seconds

    llm.engine._propose = spy
    while llm.engine.has_work:
        llm.engine.step()
        llm.engine.check_kv()
    assert [r.output_ids for r in requests] == baseline
    assert shapes and any(not chain for _, _, chain, _, _ in shapes), "no tree branched"
    budget = nodes if nodes is not None else k * width
    for drafts, depth, _, item_nodes, item_k in shapes:
        assert drafts <= item_nodes <= budget and depth <= item_k <= k
    assert sum(r.metrics.accepted_tokens for r in requests) > 0
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages


def test_draft_model_trees_feed_frontiers_with_and_without_a_window(tmp_path_factory, tiny_tokenizer_dir,
                                                                    monkeypatch):
    """After the catch-up, each draft-tree forward feeds its new frontier alone (at most w
    tokens per request), masked over every node fed so far ([q, t]: the earlier nodes' K/V is
    in the cache), and greedy outputs still equal plain decoding; also for a sliding window
    shorter than the prompts, measured on the nodes' logical positions."""
    from specd.engine import draft_tree

    width = 3
    for window in (None, 6):
        directory = tmp_path_factory.mktemp(f"tree_frontier_window{window}")
        make_tiny_model(directory, "mistral", tokenizer_dir=tiny_tokenizer_dir, lm_head_scale=10.0, seed=4,
                        sliding_window=window)
        draft = self_draft(directory, tmp_path_factory.mktemp(f"tree_frontier_window{window}_draft"))
        plain = make_llm(directory)
        assert plain.target.window == window
        prompts = prompts_of_mixed_lengths(plain.tokenizer)
        baseline = [o.token_ids for o in plain.generate(prompts, greedy())]
        fed = []
        real_forward = draft_tree.forward

        def spy(model, pool, index, segments, *args, **kw):
            for seg in segments:
                if seg.mask is not None:
                    q, t = seg.mask.shape
                    fed.append((len(seg.input_ids), q, t, seg.kv_len - t, seg.logits_from))
                    if window is not None:
                        assert len(seg.key_positions) == seg.kv_len
            return real_forward(model, pool, index, segments, *args, **kw)

        with monkeypatch.context() as patch:
            patch.setattr(draft_tree, "forward", spy)
            outs = make_llm(directory, draft, "draft", 4, spec=dict(draft_tree_width=width)).generate(prompts, greedy())
        assert [o.token_ids for o in outs] == baseline
        assert fed, "no tree forward after a catch-up"
        for new, q, t, _, logits_from in fed:
            assert new == q <= width and q <= t and logits_from == 0
        assert max(t for _, _, t, _, _ in fed) > width  # later forwards see earlier nodes from the cache
        assert sum(o.metrics.accepted_tokens for o in outs) > 0


def test_draft_model_trees_keep_the_accepted_paths_draft_kv(models, monkeypatch):
    """After verification the accepted path's draft KV (its fed nodes, moved next to the
    catch-up) becomes the draft's history, as a chain's accepted drafts' does: the next
    catch-up is 1 or 2 tokens instead of every accepted token again, and the draft proposes
    the same trees as when it drops that KV and re-feeds the accepted tokens."""
    from specd.engine import draft_tree

    _, target, draft, prompts, baseline = models

    def run(keep: bool):
        llm = make_llm(target, draft, "draft", 4, spec=dict(draft_tree_width=2))
        trees, catch_ups = [], {}
        propose = llm.engine._propose

        def spy(items, *args):
            out = propose(items, *args)
            for it in items:
                if it.k > 0:
                    trees.append((it.request.id, out[0][it.request.id].tokens.tolist()))
                    catch_ups.setdefault(it.request.id, []).append(it.draft_catch_up)
            return out

        llm.engine._propose = spy
        with monkeypatch.context() as patch:
            if not keep:
                patch.setattr(draft_tree.DraftTree, "fed_path", lambda self, path: np.zeros(0, dtype=np.int64))
            outs = llm.generate(prompts, greedy())
        assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages
        later = [n for ups in catch_ups.values() for n in ups[1:]]  # after each request's first step
        return [o.token_ids for o in outs], trees, later, sum(o.metrics.accepted_tokens for o in outs)

    kept_out, kept_trees, kept_catch_ups, accepted = run(True)
    fed_out, fed_trees, fed_catch_ups, _ = run(False)
    assert kept_out == fed_out == baseline
    assert kept_trees == fed_trees  # the moved KV is what the catch-up would have computed
    assert accepted > 0 and max(kept_catch_ups) <= 2
    assert sum(kept_catch_ups) < sum(fed_catch_ups)


def test_draft_model_trees_accept_more_per_step_than_chains(models):
    """Same depth, same correlated draft: a tree of width 2 accepts more drafts per verify
    step than the chain (its extra nodes are the draft's next most probable candidates)."""
    _, target, draft, prompts, baseline = models
    per_step = []
    for width in (1, 2):
        outs = make_llm(target, draft, "draft", 4, spec=dict(draft_tree_width=width)).generate(prompts, greedy())
        assert [o.token_ids for o in outs] == baseline
        per_step.append(sum(o.metrics.accepted_tokens for o in outs) / sum(o.metrics.verify_steps for o in outs))
    assert per_step[1] > per_step[0], per_step


def test_draft_model_trees_sampled_and_config_errors(models):
    """Sampled requests verify draft trees as one-hot candidates (seeded: reproducible, KV
    consistent); draft trees need the draft method and a width in 1..8."""
    _, target, draft, prompts, _ = models
    params = specd.SamplingParams(temperature=0.8, top_p=0.95, max_tokens=MAX_TOKENS, ignore_eos=True, seed=7)
    runs = []
    for _ in range(2):
        llm = make_llm(target, draft, "draft", 3, spec=dict(draft_tree_width=2))
        outs = llm.generate(prompts, params)
        assert all(len(o.token_ids) == MAX_TOKENS for o in outs)
        assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages
        runs.append([o.token_ids for o in outs])
    assert runs[0] == runs[1]
    with pytest.raises(specd.InvalidArgumentError, match="draft_tree_width"):
        specd.SpeculationConfig(method="ngram", draft_tree_width=2)
    with pytest.raises(specd.InvalidArgumentError, match="draft_tree_width"):
        specd.SpeculationConfig(method="draft", draft_tree_width=9)


def test_preemption_keeps_outputs(models):
    """Short prompts are all admitted, then their outputs outgrow the pool: the newest requests
    are preempted (KV freed, recomputed later) and every output is still the plain one."""
    _, target, draft, _, _ = models
    prompts = [[5 + i, 17, 3 * i + 1] for i in range(8)]
    params = greedy(max_tokens=40)
    want = [o.token_ids for o in make_llm(target).generate(prompts, params)]
    probe = make_llm(target, draft, "draft", 3, block_size=4)
    one = sum(probe.pool.blocks.pages_for_tokens(3 + 40 + 3 + 1, model=m) for m in (0, 1))
    llm = make_llm(target, draft, "draft", 3, num_kv_pages=one + 6, block_size=4)  # 8 requests need ~8x
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == want
    assert sum(o.metrics.preemptions for o in outs) > 0, "the pool was not small enough to preempt"
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages


def test_chunked_prefill_keeps_outputs(models):
    _, target, draft, prompts, baseline = models
    for method in ("none", "draft"):
        llm = make_llm(target, draft, method, 2, max_num_batched_tokens=7)
        assert [o.token_ids for o in llm.generate(prompts, greedy())] == baseline


def test_kv_pages_match_committed_lengths_after_every_step(models):
    _, target, draft, prompts, _ = models
    for method in ("draft", "ngram"):
        llm = make_llm(target, draft, method, 4, block_size=4)
        requests = llm._requests(prompts, greedy(max_tokens=30))
        for r in requests:
            llm.engine.add(r)
        steps = 0
        while llm.engine.has_work:
            llm.engine.step()
            llm.engine.check_kv()  # no reserved slots left, pages == ceil(committed / block)
            steps += 1
        assert steps > 10
        assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages


def test_stochastic_runs_are_reproducible(models):
    _, target, draft, prompts, _ = models
    for method in ("none", "draft", "ngram"):
        llm = make_llm(target, draft, method, 3)
        params = [specd.SamplingParams(temperature=0.9, top_p=0.95, max_tokens=12, ignore_eos=True, seed=100 + i)
                  for i in range(len(prompts))]
        first = [o.token_ids for o in llm.generate(prompts, params)]
        again = [o.token_ids for o in llm.generate(prompts, params)]
        assert first == again
        other = [o.token_ids for o in llm.generate(prompts, [specd.SamplingParams(
            temperature=0.9, top_p=0.95, max_tokens=12, ignore_eos=True, seed=7 + i) for i in range(len(prompts))])]
        assert other != first
        # A request's seed alone fixes its output, whatever batch it runs in.
        alone = llm.generate(prompts[3], params[3])[0].token_ids
        assert alone == first[3]


def test_mixed_sampling_parameters_in_one_batch(models):
    _, target, draft, prompts, baseline = models
    llm = make_llm(target, draft, "draft", 3)
    params = [greedy() if i % 2 == 0 else specd.SamplingParams(temperature=1.2, top_k=20, max_tokens=MAX_TOKENS,
                                                                 ignore_eos=True, seed=i) for i in range(len(prompts))]
    outs = llm.generate(prompts, params)
    for i, o in enumerate(outs):
        if i % 2 == 0:
            assert o.token_ids == baseline[i]
        else:
            assert len(o.token_ids) == MAX_TOKENS


@pytest.mark.parametrize("width,draw", [(1, "inverse_cdf"), (2, "inverse_cdf"), (1, "gumbel")])
def test_speculative_sampling_follows_the_target_distribution(models, width, draw):
    """First sampled token, 4,000 seeds: with draft-model speculation (k=3; chains, and trees
    of width 2 verified as one-hot candidates) it follows the target's next-token
    distribution at temperature 1 (chi-square, alpha = 0.001); also with the draft's tokens
    drawn by the Gumbel-max rule (KernelChoice(draw="gumbel"))."""
    _, target, draft, prompts, _ = models
    llm = make_llm(target, draft, "draft", 3, max_num_seqs=256, spec=dict(draft_tree_width=width),
                   kernels=specd.KernelChoice(draw=draw))
    prompt = prompts[4]
    n = 4000
    outs = llm.generate([prompt] * n, [specd.SamplingParams(temperature=1.0, max_tokens=2, ignore_eos=True, seed=s)
                                       for s in range(n)])
    hf = load_hf_model(target)
    with torch.no_grad():
        p = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1].double(), -1).numpy()
    counts = np.bincount([o.token_ids[0] for o in outs], minlength=len(p))
    big = p * n >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(p[big], p[~big].sum()) * n
    assert sum(o.metrics.accepted_tokens for o in outs) > n // 10  # drafts were accepted
    assert stats.chisquare(observed, expected).pvalue > 0.001


@pytest.mark.parametrize("draw", ["inverse_cdf", "gumbel"])
def test_plain_sampling_follows_the_target_distribution(models, draw):
    """Plain decoding (no drafts: every step is a root-only tree), under both draws of
    KernelChoice.draw (verification of the root; ``specd.ops.sample_tokens`` with the
    Gumbel-max draw): the first sampled token of 3,000 seeds follows the target's next-token
    distribution (temperature 0.8, chi-square, alpha = 0.001), and the two draw other tokens
    for the same seeds."""
    _, target, _, prompts, _ = models
    n = 3000
    params = [specd.SamplingParams(temperature=0.8, max_tokens=1, ignore_eos=True, seed=s) for s in range(n)]
    prompt = prompts[2]
    firsts = {}
    for draw in {draw, "inverse_cdf"}:
        llm = make_llm(target, max_num_seqs=256, kernels=specd.KernelChoice(draw=draw))
        firsts[draw] = [o.token_ids[0] for o in llm.generate([prompt] * n, params)]
    hf = load_hf_model(target)
    with torch.no_grad():
        p = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1].double() / 0.8, -1).numpy()
    counts = np.bincount(firsts[draw], minlength=len(p))
    big = p * n >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(p[big], p[~big].sum()) * n
    assert stats.chisquare(observed, expected).pvalue > 0.001
    if draw == "gumbel":
        assert firsts["gumbel"] != firsts["inverse_cdf"]


def test_stream_yields_the_generated_text(models):
    _, target, draft, prompts, _ = models
    llm = make_llm(target, draft, "draft", 3)
    params = greedy(max_tokens=15)
    chunks = list(llm.stream(prompts[3], params))
    full = llm.generate(prompts[3], params)[0]
    assert "".join(c.text for c in chunks) == full.text
    assert sum((c.token_ids for c in chunks), []) == full.token_ids
    assert chunks[-1].finished and chunks[-1].finish_reason == "length"
    assert not any(c.finished for c in chunks[:-1])
    flags = sum((c.accepted for c in chunks), [])
    assert len(flags) == 15 and any(flags)


def test_incremental_text_equals_one_decode(models):
    """The engine's incremental detokenizer, on its fast path (the tokenizer's Rust backend)
    and through transformers' decode, gives piece by piece the text one decode of the whole
    output gives; characters split over several byte tokens come out once complete."""
    from specd.engine.request import Detokenizer

    _, target, _, _, _ = models
    tok = make_llm(target).tokenizer
    ids = tok(CODE_SNIPPET + "naïve café 東京 🙂 done\n")["input_ids"]
    prompt, out = ids[:10], ids[10:]

    class SlowPath:  # no backend_tokenizer: every decode goes through transformers
        def decode(self, token_ids, skip_special_tokens):
            return tok.decode(token_ids, skip_special_tokens=skip_special_tokens)

    context = prompt[-6:]
    want = tok.decode(context + out)[len(tok.decode(context)):]
    pieces = {}
    for name, t in (("fast", tok), ("slow", SlowPath())):
        detok = Detokenizer(t, prompt)
        pieces[name] = [detok.push(x) for x in out]
        assert "".join(pieces[name]) == want
    assert pieces["fast"] == pieces["slow"]
    assert pieces["fast"].count("") > 3  # multi-byte characters were held back a token or more

    # push_many over any split of the output: after each chunk, the same text as pushing its
    # tokens one by one (chunks ending inside a character included: held back the same way).
    rng = np.random.default_rng(0)
    per_token = np.cumsum([0] + [len(p) for p in pieces["fast"]])
    for _ in range(20):
        cuts = np.sort(rng.choice(np.arange(1, len(out)), size=8, replace=False))
        detok, text = Detokenizer(tok, prompt), ""
        for a, b in zip([0, *cuts], [*cuts, len(out)]):
            text += detok.push_many(out[a:b])
            assert text == want[:per_token[b]]


def test_text_made_on_read_equals_text_per_token(models):
    """Request.text decodes on read (no detokenization per step); reads at any points, and
    pieces read after a text-only read, give the text and pieces of token-by-token pushes."""
    from specd.engine.request import Detokenizer, Request

    _, target, _, _, _ = models
    tok = make_llm(target).tokenizer
    ids = tok(CODE_SNIPPET + "naïve café 東京 🙂 done\n")["input_ids"]
    prompt, out = ids[:10], ids[10:]
    detok = Detokenizer(tok, prompt)
    want_pieces = [detok.push(t) for t in out]

    def request():
        return Request(0, None, list(prompt), specd.SamplingParams(max_tokens=len(out) + 1), 0, 0, 10_000,
                       frozenset(), detokenizer=Detokenizer(tok, prompt))

    for reads in (["text"], ["pieces"], ["text", "pieces"], ["pieces", "text"]):
        req, step = request(), 0
        while step < len(out):
            req.emit(out[step:step + 3], 2)
            step += 3
            for what in reads:
                getattr(req, what)
            assert req.tokens == prompt + out[:step]
        assert req.text == "".join(want_pieces)
        assert req.pieces == want_pieces
        assert req.text == "".join(want_pieces)  # unchanged by the pieces' rebuild


def test_stop_string_token_and_eos(models):
    _, target, _, prompts, baseline = models
    llm = make_llm(target, method="ngram", k=3)
    full = llm.generate(prompts[2], greedy())[0]
    stop = full.text[len(full.text) // 2:len(full.text) // 2 + 3]
    cut = llm.generate(prompts[2], greedy(stop=[stop]))[0]
    assert cut.finish_reason == "stop" and cut.text == full.text[:full.text.find(stop)]
    token = baseline[2][5]
    by_token = llm.generate(prompts[2], greedy(stop_token_ids=[token]))[0]
    assert by_token.finish_reason == "stop" and by_token.token_ids == baseline[2][:baseline[2].index(token) + 1]
    eos_run = llm.generate(prompts[2], specd.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))[0]
    if EOS_TOKEN_ID in baseline[2]:
        assert eos_run.token_ids[-1] == EOS_TOKEN_ID and eos_run.finish_reason == "stop"
    else:
        assert eos_run.token_ids == baseline[2]


def test_errors(models, tmp_path, tiny_tokenizer_dir):
    _, target, draft, prompts, _ = models
    llm = make_llm(target, max_model_len=64)
    with pytest.raises(ValueError, match="context limit of 64"):
        llm.generate([list(range(1, 70))], greedy())
    with pytest.raises(ValueError, match="temperature"):
        specd.SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        specd.SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="max_tokens"):
        specd.SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="method"):
        specd.SpeculationConfig(method="magic")
    with pytest.raises(ValueError, match="needs a draft model"):
        specd.LLM(target, None, specd.SpeculationConfig(method="draft"))
    with pytest.raises(ValueError, match="2 prompts but 1"):
        llm.generate(prompts[:2], [greedy()])
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], greedy())
    for bad in ([1, 10**6], [1, -1], [1, 2.0], [1, "a"], [1, None], [[1, 2], [3, 4]]):
        with pytest.raises(ValueError, match="token ids"):
            llm.generate([bad], greedy())
    # numpy integer ids are ids: the same output as Python ints
    ids = prompts[0] if not isinstance(prompts[0], str) else llm.tokenizer(prompts[0])["input_ids"]
    want = llm.generate([list(ids)], greedy(max_tokens=3))[0].token_ids
    for given in ([np.asarray(ids, dtype=np.int32)], np.asarray(ids), np.asarray([ids])):
        assert [o.token_ids for o in llm.generate(given, greedy(max_tokens=3))] == [want]
    small = make_llm(target, num_kv_pages=2, block_size=4)
    with pytest.raises(ValueError, match="KV pages"):
        small.generate(prompts[4], greedy(max_tokens=50))
    other = tmp_path / "other_vocab"
    make_tiny_model(other, "llama", vocab_size=300, hidden_size=32, layers=1)
    with pytest.raises(errors.IncompatibleModelsError):
        specd.LLM(target, other, specd.SpeculationConfig(method="draft"))
    # Nothing is left behind by the failed calls: the engine still works.
    assert llm.generate(prompts[0], greedy(max_tokens=3))[0].finish_reason == "length"


def poison_target_rows(monkeypatch, victim_id, from_call, value=float("nan")):
    """Makes the target's logits rows of request ``victim_id`` hold ``value`` (in one logit of
    each row; -inf in every logit, leaving no finite one) from the ``from_call``-th target
    forward in which it verifies onwards."""
    from specd.engine import model_runner

    run_target = model_runner.run_target
    calls = [0]

    def poisoned(target, pool, items, trees, graph=None, drafts=None):
        logits = run_target(target, pool, items, trees, graph=graph, drafts=drafts)
        row = 0
        for it in items:
            if not it.decide:
                continue
            n = len(trees[it.request.id])
            if it.request.id == victim_id:
                calls[0] += 1
                if calls[0] >= from_call:
                    logits = logits.clone()
                    logits[row:row + n, slice(None) if value == float("-inf") else 5] = value
            row += n
        return logits

    monkeypatch.setattr(model_runner, "run_target", poisoned)


@pytest.mark.parametrize("method", ["draft", "ngram", "draft-runners"])
@pytest.mark.parametrize("sampled", [False, True])
def test_a_failed_verification_ends_only_its_request(models, monkeypatch, method, sampled):
    """Non-finite logits in one request's rows end that request alone, with finish_reason
    "error" and a message naming it; the others' outputs are those of a run without the
    fault, and every KV page comes back. "draft-runners": both graph runners, so the drafts
    stay on the device until verification reads them (Engine.device_drafts)."""
    _, target, draft, prompts, baseline = models
    runners = dict(draft_graph=True, target_graph=True) if method == "draft-runners" else {}
    llm = make_llm(target, draft, method.split("-")[0], 3, **runners)
    if sampled:
        params = [specd.SamplingParams(temperature=0.9, top_k=30, max_tokens=MAX_TOKENS, ignore_eos=True, seed=50 + i)
                  for i in range(len(prompts))]
        expected = [o.token_ids for o in llm.generate(prompts, params)]
    else:
        params, expected = greedy(), baseline
    victim = 3
    poison_target_rows(monkeypatch, victim_id=llm._next_id + victim, from_call=3)
    outs = llm.generate(prompts, params)
    for i, o in enumerate(outs):
        if i == victim:
            assert o.finish_reason == "error"
            assert f"request {o.request_id}: verification failed" in o.error
            assert o.token_ids == expected[i][:len(o.token_ids)] and len(o.token_ids) < MAX_TOKENS
        else:
            assert (o.token_ids, o.finish_reason, o.error) == (expected[i], "length", None)
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages
    assert not llm.engine.has_work


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_a_failed_verification_ends_a_stream_with_the_error(models, monkeypatch, value):
    """+inf in a row, or no finite logit at all (every one -inf), also fails the request."""
    _, target, _, prompts, baseline = models
    llm = make_llm(target)
    poison_target_rows(monkeypatch, victim_id=llm._next_id, from_call=2, value=value)
    chunks = list(llm.stream(prompts[1], greedy()))
    last = chunks[-1]
    assert last.finished and last.finish_reason == "error" and "request 0" in last.error
    assert sum((c.token_ids for c in chunks), []) == baseline[1][:1]
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages
    # The LLM serves the next request normally.
    assert llm.generate(prompts[2], greedy())[0].token_ids == baseline[2]
