"""Automatic prefix caching end to end on tiny models: requests sharing a prompt prefix with
earlier ones adopt its KV (target and draft) instead of prefilling it, and every output is
the one of an engine without the cache: greedy token for token with every proposer, seeded
sampling draw for draw, logprobs, multi-turn chats, eviction under memory pressure,
preemption, prompt_logprobs (which opt out), and the figures the engine reports."""

import pytest

import specd
from tiny_models import CODE_SNIPPET

BLOCK = 4  # small blocks: short test prompts span several


def greedy(max_tokens=16, **kw):
    return specd.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def make_llm(target, draft=None, method="none", k=3, caching=True, **kw):
    spec = specd.SpeculationConfig(method=method, num_speculative_tokens=k, **kw.pop("spec", {}))
    kw.setdefault("block_size", BLOCK)
    return specd.LLM(target, draft if method == "draft" else None, spec, enable_prefix_caching=caching, **kw)


@pytest.fixture(scope="module")
def shared(tiny_llama_dir, tiny_llama_draft_dir):
    """Prompts that share a long 'system prompt' (the code snippet) and differ after it."""
    probe = make_llm(tiny_llama_dir, caching=False)
    system = probe.tokenizer(CODE_SNIPPET)["input_ids"]
    tails = ["# one", "print(fibonacci(5))", "x = [fibonacci(i) for i in range(3)]", "def g():"]
    prompts = [system + probe.tokenizer(t)["input_ids"] for t in tails]
    return tiny_llama_dir, tiny_llama_draft_dir, system, prompts


def run_twice(llm, prompts, params):
    """The first prompt alone (it fills the cache), then all of them."""
    first = llm.generate(prompts[:1], params[:1] if isinstance(params, list) else params)
    return first + llm.generate(prompts, params)


@pytest.mark.parametrize("method,spec", [("none", {}), ("ngram", {}), ("suffix", {}), ("draft", {}),
                                         ("draft", {"draft_tree_width": 2})])
def test_cached_prefixes_keep_greedy_outputs(shared, method, spec):
    target, draft, system, prompts = shared
    params = greedy()
    cold = run_twice(make_llm(target, draft, method, caching=False, spec=spec), prompts, params)
    llm = make_llm(target, draft, method, spec=spec)
    warm = run_twice(llm, prompts, params)
    assert [o.token_ids for o in warm] == [o.token_ids for o in cold]
    # The second batch found the system prompt's whole blocks (its first prompt: all but the last token).
    shared_blocks = len(system) // BLOCK * BLOCK
    assert warm[0].num_cached_tokens == 0
    assert warm[1].num_cached_tokens == (len(prompts[0]) - 1) // BLOCK * BLOCK
    for out in warm[2:]:
        assert out.num_cached_tokens >= shared_blocks
        assert out.metrics.prefilled_tokens == len(out.prompt_token_ids) - 1 - out.num_cached_tokens
    assert all(o.num_cached_tokens == 0 for o in cold)
    if method == "draft":  # the draft's KV came from the cache too, and it proposed exactly as before
        assert [o.metrics.accepted_tokens for o in warm] == [o.metrics.accepted_tokens for o in cold]
    stats = llm.prefix_cache_stats()
    assert stats["hit_tokens"] == sum(o.num_cached_tokens for o in warm)
    assert stats["query_tokens"] == sum(len(o.prompt_token_ids) for o in warm)
    assert 0 < stats["hit_rate"] < 1
    llm.engine.check_kv()
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages  # cached pages count as free


def test_graph_runners_attend_over_adopted_pages(shared):
    """The target and draft graph runners (their CPU references) build block tables that
    start with the adopted pages; outputs and the draft's acceptance stay those of a run
    without the cache."""
    target, draft, _, prompts = shared
    kw = dict(target_graph=True, draft_graph=True)
    cold = run_twice(make_llm(target, draft, "draft", caching=False, **kw), prompts, greedy())
    llm = make_llm(target, draft, "draft", **kw)
    warm = run_twice(llm, prompts, greedy())
    assert [o.token_ids for o in warm] == [o.token_ids for o in cold]
    assert [o.metrics.accepted_tokens for o in warm] == [o.metrics.accepted_tokens for o in cold]
    assert sum(o.num_cached_tokens for o in warm) > 0
    llm.engine.check_kv()


def test_seeded_sampling_and_logprobs_are_unchanged(shared):
    target, draft, _, prompts = shared
    params = [specd.SamplingParams(temperature=0.8, top_p=0.9, max_tokens=12, ignore_eos=True, seed=40 + i,
                                   logprobs=2) for i in range(len(prompts))]
    cold = run_twice(make_llm(target, draft, "draft", caching=False), prompts, params)
    warm = run_twice(make_llm(target, draft, "draft"), prompts, params)
    assert [o.token_ids for o in warm] == [o.token_ids for o in cold]
    assert sum(o.num_cached_tokens for o in warm) > 0
    for w, c in zip(warm, cold):
        for lw, lc in zip(w.logprobs, c.logprobs):
            assert lw.keys() == lc.keys()
            for t in lw:
                assert lw[t].logprob == pytest.approx(lc[t].logprob, abs=1e-4)


def test_a_chat_turn_reuses_the_previous_turn(shared):
    """The next turn's prompt is the last prompt, the answer and a new message: all of the
    earlier turn's full blocks (prompt and generated tokens) come from the cache."""
    target, _, _, prompts = shared
    llm = make_llm(target)
    first = llm.generate([prompts[1]], greedy(max_tokens=20))[0]
    turn = first.prompt_token_ids + first.token_ids + prompts[2][-6:]
    second = llm.generate([turn], greedy())[0]
    # Its KV covered every token but the last generated one when it finished.
    assert second.num_cached_tokens == (len(first.prompt_token_ids) + len(first.token_ids) - 1) // BLOCK * BLOCK
    assert second.token_ids == make_llm(target, caching=False).generate([turn], greedy())[0].token_ids


def test_eviction_and_preemption_under_memory_pressure(shared):
    """A pool too small for the batch: cached blocks are evicted (oldest first) to make room,
    requests are preempted and re-adopt their own blocks, and outputs stay exact."""
    target, draft, _, prompts = shared
    many = [p + [7 + i, 11 + i] for i, p in enumerate(prompts * 3)]
    params = greedy(max_tokens=24)
    want = [o.token_ids for o in make_llm(target, draft, "draft", caching=False).generate(many, params)]
    probe = make_llm(target, draft, "draft")
    one = sum(probe.pool.blocks.pages_for_tokens(len(many[0]) + 24 + 4, model=m) for m in (0, 1))
    llm = make_llm(target, draft, "draft", num_kv_pages=2 * one + 4)
    outs = llm.generate(many, params)
    assert [o.token_ids for o in outs] == want
    stats = llm.prefix_cache_stats()
    assert stats["evictions"] > 0
    assert stats["hit_tokens"] > 0
    assert sum(o.metrics.preemptions for o in outs) > 0, "the pool was not small enough to preempt"
    llm.pool.blocks.check_invariants()
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages


def test_prompt_logprobs_requests_compute_their_whole_prompt(shared):
    target, _, _, prompts = shared
    llm = make_llm(target)
    llm.generate(prompts[:1], greedy())
    params = greedy(max_tokens=4, prompt_logprobs=1)
    got = llm.generate(prompts[:1], params)[0]
    want = make_llm(target, caching=False).generate(prompts[:1], params)[0]
    assert got.num_cached_tokens == 0
    assert len(got.prompt_logprobs) == len(prompts[0])
    for a, b in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:]):
        assert a.keys() == b.keys()
    # Its blocks were cached all the same: a later plain request finds them.
    assert llm.generate(prompts[:1], greedy())[0].num_cached_tokens > 0


def test_off_reset_and_reporting(shared):
    target, _, _, prompts = shared
    off = make_llm(target, caching=False)
    assert not off.prefix_caching and off.prefix_cache_stats() == {}
    assert "prefix_cache" not in off.metrics()
    llm = make_llm(target)
    llm.generate(prompts[:1], greedy())
    assert llm.pool.blocks.prefix_cache_stats["cached_pages"] > 0
    assert llm.metrics()["prefix_cache"]["cached_pages"] > 0
    llm.reset_prefix_cache()
    assert llm.pool.blocks.prefix_cache_stats["cached_pages"] == 0
    assert llm.generate(prompts[:1], greedy())[0].num_cached_tokens == 0
    llm.reset()  # as a new LLM: an empty cache
    assert llm.pool.blocks.prefix_cache_stats["cached_pages"] == 0
    assert llm.generate(prompts[:1], greedy())[0].num_cached_tokens == 0


def test_block_manager_prefix_api_errors():
    bm = specd.BlockManager(page_bytes=64, num_pages=8, models=[("target", 16)], prefix_caching=True)
    bm.add_sequence(1)
    bm.reserve(1, 8)
    bm.commit(1, 8)
    bm.cache_blocks(1, list(range(8)))
    bm.add_sequence(2)
    assert bm.cached_prefix(list(range(9)), 8) == 8 and bm.cached_prefix(list(range(9)), 7) == 4
    assert bm.cached_prefix([5] * 9, 8) == 0
    assert bm.prefix_cache_stats["hit_pages"] == 0  # (a look, not an adoption)
    assert bm.match_prefix(2, list(range(9)), 8) == 8
    assert bm.pages(2).tolist() == bm.pages(1).tolist()
    with pytest.raises(specd.FailedPreconditionError, match="empty sequence"):
        bm.match_prefix(2, list(range(9)), 8)
    with pytest.raises(specd.UnknownSequenceError):
        bm.cache_blocks(99, [1, 2])
    with pytest.raises(specd.InvalidArgumentError, match="unknown model"):
        bm.match_prefix(2, [1], 1, model="draft")
    assert bm.prefix_cache_stats["hit_pages"] == 2


def test_prefix_caching_on_cuda_keeps_greedy_outputs(shared):
    """The same on a GPU, where the graph runners verify and draft (their block tables start
    at the adopted pages)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    target, draft, _, prompts = shared
    for method in ("none", "draft"):
        cold = run_twice(make_llm(target, draft, method, caching=False, device="cuda"), prompts, greedy())
        llm = make_llm(target, draft, method, device="cuda")
        warm = run_twice(llm, prompts, greedy())
        assert [o.token_ids for o in warm] == [o.token_ids for o in cold]
        assert sum(o.num_cached_tokens for o in warm) > 0
        llm.engine.check_kv()


def test_the_policy_is_told_a_waiting_prompts_work_net_of_the_cache(shared):
    """A waiting request whose prompt starts with cached blocks is offered to the policy with
    the tokens it would prefill (and the draft would catch up) after adopting them: what the
    step will compute, not its whole prompt (the goodput controller prices steps and
    forecasts load from these)."""
    target, draft, system, prompts = shared
    llm = make_llm(target, draft, method="draft", policy="goodput")
    seen = {}
    real = llm.engine.policy.decide

    def decide(batch):
        for s in batch:
            seen.setdefault(s.request.id, (s.base_tokens, s.draft_catch_up))
        return real(batch)
    llm.engine.policy.decide = decide
    first = llm.generate(prompts[:1], greedy())[0]
    second = llm.generate(prompts[1:2], greedy())[0]
    cached = second.num_cached_tokens
    assert cached >= len(system) // BLOCK * BLOCK - BLOCK > 0
    assert seen[0] == (len(first.prompt_token_ids), len(first.prompt_token_ids))  # nothing cached yet
    base, catch_up = seen[1]
    assert base == len(second.prompt_token_ids) - cached
    # the draft adopts whole blocks of its own size (a page holds more of its smaller tokens)
    draft_cached = len(second.prompt_token_ids) - catch_up
    assert draft_cached > 0 and draft_cached % llm.pool.block_size(1) == 0 and catch_up < len(second.prompt_token_ids)
    uncached = make_llm(target, draft, method="draft", policy="goodput", caching=False)
    seen.clear()
    uncached.engine.policy.decide = decide
    real = uncached.engine.policy.__class__.decide.__get__(uncached.engine.policy)
    uncached.generate(prompts[:2], greedy())
    assert [v[0] for v in seen.values()] == [len(p) for p in prompts[:2]]
