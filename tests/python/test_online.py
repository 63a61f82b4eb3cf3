"""Online serving through LLM.add_request / step / abort_request: requests arriving between
steps join the running batch, their chunks add up to what generate gives (greedy
speculation stays lossless), aborts free their KV without touching the others, and bad
ids or parameters raise."""

import pytest

import specd
from specd import errors
from test_engine import greedy, make_llm, prompts_of_mixed_lengths, self_draft


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_llama_dir):
    draft = self_draft(tiny_llama_dir, tmp_path_factory.mktemp("online_draft"))
    plain = make_llm(tiny_llama_dir)
    prompts = prompts_of_mixed_lengths(plain.tokenizer)
    texts = ["def f(a, b):", "import os\nimport sys\n", "for i in range(10):\n    print(i)\n" * 2]
    reference = plain.generate(prompts + texts, greedy())
    return tiny_llama_dir, draft, prompts + texts, reference


def serve(llm, arrivals, abort=None):
    """arrivals: (step, prompt, params) in order of index; prompt i is added before step
    arrivals[i][0]. ``abort``: {step: index} aborts that request then. Returns every
    request's chunks (by index) and the largest batch seen."""
    ids, chunks, step, added = {}, {}, 0, 0
    most_running = 0
    while added < len(arrivals) or llm.has_unfinished_requests():
        while added < len(arrivals) and arrivals[added][0] <= step:
            ids[llm.add_request(*arrivals[added][1:])] = added
            added += 1
        if abort and step in abort:
            assert llm.abort_request(next(r for r, i in ids.items() if i == abort[step]))
        for c in llm.step():
            chunks.setdefault(ids[c.request_id], []).append(c)
        most_running = max(most_running, len(llm.engine.scheduler.running))
        step += 1
        assert step < 500
    return chunks, most_running


@pytest.mark.parametrize("method", ["none", "draft", "ngram"])
def test_requests_added_between_steps_equal_generate(pair, method):
    target, draft, prompts, reference = pair
    llm = make_llm(target, draft, method, 3)
    # Three at once, then one every other step.
    chunks, most_running = serve(llm, [(max(0, 2 * (i - 2)), prompts[i], greedy()) for i in range(len(prompts))])
    assert most_running >= 4  # they did run together
    assert sorted(chunks) == list(range(len(prompts)))
    for i, cs in chunks.items():
        ref = reference[i]
        assert sum((c.token_ids for c in cs), []) == ref.token_ids
        assert "".join(c.text for c in cs) == ref.text
        assert [c.finished for c in cs] == [False] * (len(cs) - 1) + [True]
        assert cs[-1].finish_reason == "length" and cs[-1].metrics.generated_tokens == len(ref.token_ids)
        assert all(c.token_ids or c.text or c.finished for c in cs)  # no empty chunks
    assert llm.step() == [] and not llm.has_unfinished_requests()
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages


def test_abort_ends_only_that_request(pair):
    target, draft, prompts, reference = pair
    llm = make_llm(target, draft, "draft", 3)
    chunks, _ = serve(llm, [(0, prompts[i], greedy()) for i in range(4)], abort={3: 1})
    aborted = chunks[1]
    assert aborted[-1].finished and aborted[-1].finish_reason == "abort"
    got = sum((c.token_ids for c in aborted), [])
    assert 0 < len(got) < len(reference[1].token_ids) and got == reference[1].token_ids[:len(got)]
    for i in (0, 2, 3):
        assert sum((c.token_ids for c in chunks[i]), []) == reference[i].token_ids
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages
    # An ended request cannot be aborted again; an id never given out is an error.
    assert llm.abort_request(1) is False
    with pytest.raises(errors.UnknownSequenceError, match="no request 99"):
        llm.abort_request(99)


def test_abort_before_the_first_step_and_bad_requests(pair):
    target, _, prompts, _ = pair
    llm = make_llm(target, max_model_len=64)
    rid = llm.add_request(prompts[0], greedy())
    assert llm.has_unfinished_requests()
    assert llm.abort_request(rid) is True
    assert [(c.request_id, c.finished, c.finish_reason, c.token_ids) for c in llm.step()] == [(rid, True, "abort", [])]
    assert not llm.has_unfinished_requests() and llm.step() == []
    with pytest.raises(ValueError, match="context limit of 64"):
        llm.add_request(list(range(1, 70)), greedy())
    with pytest.raises(ValueError, match="params must be a specd.SamplingParams"):
        llm.add_request(prompts[0], {"max_tokens": 3})
    assert not llm.has_unfinished_requests()  # nothing was queued by the failed calls
    # generate() in between: the online request keeps going and reports with the next step.
    rid = llm.add_request(prompts[2], greedy(max_tokens=5))
    assert len(llm.generate(prompts[1], greedy(max_tokens=30))[0].token_ids) == 30
    chunks = llm.step()
    assert [c.request_id for c in chunks] == [rid] and chunks[0].finished and len(chunks[0].token_ids) == 5


def test_a_queue_longer_than_the_batch(pair):
    """Six requests at once with room for two: step() reports only requests that ran or
    ended (no chunk for the waiting ones), a waiting request aborted gets its final chunk at
    the next step, and the others still equal generate."""
    target, draft, prompts, reference = pair
    llm = make_llm(target, draft, "draft", 3, max_num_seqs=2)
    ids = [llm.add_request(prompts[i], greedy()) for i in range(6)]
    first = llm.step()
    assert {c.request_id for c in first} <= set(ids[:2])  # the running two at most
    assert llm.abort_request(ids[5]) is True  # still waiting
    chunks = {rid: [] for rid in ids}
    for c in first:
        chunks[c.request_id].append(c)
    while llm.has_unfinished_requests():
        running = {r.id for r in llm.engine.scheduler.running}
        step = llm.step()
        for c in step:
            chunks[c.request_id].append(c)
        # a chunk comes from a request that ran in this step or ended (the abort)
        assert all(c.finished or c.request_id in running | {r.id for r in llm.engine.scheduler.running}
                   for c in step)
    assert [(c.finish_reason, c.token_ids) for c in chunks[ids[5]]] == [("abort", [])]
    for i in range(5):
        assert sum((c.token_ids for c in chunks[ids[i]]), []) == reference[i].token_ids
        assert chunks[ids[i]][-1].finish_reason == "length"
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages


def test_generate_after_online_requests_leaves_nothing_to_report(pair):
    """Requests of generate and stream are never reported by step(), so the engine does not
    keep their ids for it: after an online request ended, a generate adds nothing to
    Engine.touched (it would grow with every request otherwise), and step() is []."""
    target, draft, prompts, reference = pair
    llm = make_llm(target, draft, "draft", 3)
    rid = llm.add_request(prompts[0], greedy())
    got = []
    while llm.has_unfinished_requests():
        got += [c for c in llm.step() if c.request_id == rid]
    assert sum((c.token_ids for c in got), []) == reference[0].token_ids
    outs = llm.generate(prompts[1:4], greedy())
    assert [o.token_ids for o in outs] == [r.token_ids for r in reference[1:4]]
    assert llm.engine.touched == set()
    assert llm.step() == []
    # an online request added while generate runs is still reported after it
    rid = llm.add_request(prompts[0], greedy())
    llm.generate(prompts[1:2], greedy())
    assert llm.engine.touched == {rid}
    got = []
    while llm.has_unfinished_requests():
        got += llm.step()
    assert {c.request_id for c in got} == {rid}
    assert sum((c.token_ids for c in got), []) == reference[0].token_ids
