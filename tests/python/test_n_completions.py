"""SamplingParams.n: a prompt's completions in RequestOutput.outputs, each what n = 1 gives with
its seed (seed + i), with and without speculation; later completions adopt the prompt's KV
from the first (prefilled once) with prefix caching, the same tokens without it; add_request's
``follows`` does the same online; bad n is refused."""

import pytest

import specd

PROMPT = list(range(3, 103))  # 100 tokens: six whole 16-token blocks before the last token


def make_llm(target, draft=None, method="none", **kw):
    return specd.LLM(target, draft, specd.SpeculationConfig(method=method, num_speculative_tokens=3), **kw)


@pytest.mark.parametrize("method", ["none", "draft", "ngram"])
def test_each_completion_is_what_its_seed_gives_alone(tiny_llama_dir, tiny_llama_draft_dir, method):
    llm = make_llm(tiny_llama_dir, tiny_llama_draft_dir if method == "draft" else None, method)
    params = specd.SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    out, other = llm.generate([PROMPT, PROMPT[:40]], params)
    assert [c.index for c in out.outputs] == [0, 1, 2, 3] and len(other.outputs) == 4
    for i, c in enumerate(out.outputs):
        alone = llm.generate([PROMPT], specd.SamplingParams(temperature=1.0, seed=7 + i, max_tokens=12,
                                                            ignore_eos=True))[0]
        assert c.token_ids == alone.token_ids and c.text == alone.text and c.finish_reason == "length"
    assert (out.text, out.token_ids, out.metrics) == (out.outputs[0].text, out.outputs[0].token_ids,
                                                      out.outputs[0].metrics)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1, "the completions are not independent draws"


def test_unseeded_completions_are_distinct_draws(tiny_llama_dir):
    out = make_llm(tiny_llama_dir).generate([PROMPT], specd.SamplingParams(n=3, temperature=1.0, max_tokens=16,
                                                                           ignore_eos=True))[0]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3


def test_later_completions_adopt_the_first_ones_prompt(tiny_llama_dir, tiny_llama_draft_dir):
    """With prefix caching, completions 1..n-1 take the prompt's whole blocks (96 of its 100
    tokens) from completion 0; without it every completion prefills the prompt. Same tokens,
    with the draft model (whose blocks are adopted too)."""
    params = specd.SamplingParams(n=4, temperature=0.8, seed=3, max_tokens=8, ignore_eos=True)
    cached = make_llm(tiny_llama_dir, tiny_llama_draft_dir, "draft").generate([PROMPT], params)[0]
    plain = make_llm(tiny_llama_dir, tiny_llama_draft_dir, "draft",
                     enable_prefix_caching=False).generate([PROMPT], params)[0]
    assert [c.token_ids for c in cached.outputs] == [c.token_ids for c in plain.outputs]
    assert [c.metrics.cached_tokens for c in cached.outputs] == [0, 96, 96, 96]
    # (a prompt's last token is fed by its first verify step, not prefilled)
    assert [c.metrics.prefilled_tokens for c in cached.outputs] == [99, 3, 3, 3]
    assert [c.metrics.prefilled_tokens for c in plain.outputs] == [99] * 4


def test_add_request_follows(tiny_llama_dir):
    """Online: a request that follows another with the same prompt adopts its prompt; one that
    follows nothing prefills; aborting a follower still held ends it alone."""
    llm = make_llm(tiny_llama_dir)
    params = specd.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    lead = llm.add_request(PROMPT, params)
    follower = llm.add_request(PROMPT, params, follows=lead)
    dropped = llm.add_request(PROMPT, params, follows=lead)
    assert llm.abort_request(dropped)
    done = {}
    while llm.has_unfinished_requests():
        for chunk in llm.step():
            if chunk.finished:
                done[chunk.request_id] = chunk
    assert done[dropped].finish_reason == "abort"
    assert done[lead].metrics.cached_tokens == 0 and done[follower].metrics.cached_tokens == 96
    assert not llm.engine.has_work
    short = llm.add_request(PROMPT[:12], params)  # no whole block to share: not held back
    llm.add_request(PROMPT[:12], params, follows=short)
    assert llm.engine._held == [] and llm.engine.scheduler.num_waiting == 2


def test_bad_n_is_refused(tiny_llama_dir):
    for bad in (0, -1, 1.5, True, 129):
        with pytest.raises(specd.InvalidArgumentError, match="n must be"):
            specd.SamplingParams(n=bad)
    llm = make_llm(tiny_llama_dir)
    with pytest.raises(specd.InvalidArgumentError, match="LLM.stream takes SamplingParams.n = 1"):
        next(llm.stream(PROMPT, specd.SamplingParams(n=2)))
    with pytest.raises(specd.InvalidArgumentError, match="LLM.add_request takes SamplingParams.n = 1"):
        llm.add_request(PROMPT, specd.SamplingParams(n=2))
    assert not llm.engine.has_work
    seeded = specd.SamplingParams(n=3, seed=2**64 - 2).completions()
    assert [p.seed for p in seeded] == [2**64 - 2, 2**64 - 1, 0] and all(p.n == 1 for p in seeded)


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_completions_under_memory_pressure(tiny_llama_dir, tiny_llama_draft_dir, method):
    """Several prompts with n = 3 (sampled, seeded; greedy; a penalty) in a pool too small for
    the batch: leaders and followers are preempted and re-admitted, followers adopt what is
    cached; every completion equals the one a roomy pool without prefix caching gives, and
    the pool ends empty."""
    prompts = [PROMPT, PROMPT[5:90], [7] * 40 + PROMPT[:30], PROMPT[:20]]
    params = [specd.SamplingParams(n=3, temperature=0.9, seed=11, max_tokens=20, ignore_eos=True),
              specd.SamplingParams(n=3, temperature=0.0, max_tokens=16, ignore_eos=True),
              specd.SamplingParams(n=3, temperature=0.7, seed=5, max_tokens=18, presence_penalty=0.5,
                                   ignore_eos=True),
              specd.SamplingParams(n=2, temperature=1.0, seed=2, max_tokens=12, ignore_eos=True)]
    draft = tiny_llama_draft_dir if method == "draft" else None
    want = make_llm(tiny_llama_dir, draft, method, enable_prefix_caching=False).generate(prompts, params)
    probe = make_llm(tiny_llama_dir, draft, method)
    one = sum(probe.pool.blocks.pages_for_tokens(len(PROMPT) + 20 + 4, model=m) for m in range(len(probe.pool.models)))
    llm = make_llm(tiny_llama_dir, draft, method, num_kv_pages=one + 1)
    got = llm.generate(prompts, params)
    for g, w in zip(got, want):
        assert [c.token_ids for c in g.outputs] == [c.token_ids for c in w.outputs]
    completions = [c for g in got for c in g.outputs]
    assert sum(c.metrics.preemptions for c in completions) > 0, "the pool was not small enough to preempt"
    assert sum(c.metrics.cached_tokens for c in completions) > 0
    llm.pool.blocks.check_invariants()
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages and not llm.engine.has_work
