"""Draft-model trees grown on the device (specd.engine.draft_tree_graph): with
``LLM(..., draft_graph=True)`` and ``draft_tree_width > 1`` every draft call grows, from one
record read per call, exactly the builder the host loop (draft_tree.run_draft_tree without a
runner) grows: the same candidates, path probabilities and parents, hence the same trees; the
engine's greedy outputs equal plain decoding; padding buckets, mixed k, short frontiers (top-k
below the width), requests whose candidates all have probability 0, and forward 0 eager after
prefills. GPU: the captured graphs replay what the runner's eager code computes, with no host
synchronisation before the record's read (skips without a GPU)."""

from dataclasses import replace
from typing import NamedTuple

import numpy as np
import pytest
import torch

import specd
from specd import errors
from specd.engine import draft_tree, engine as engine_module
from specd.engine.draft_graph import DraftGraphRunner
from specd.engine.draft_tree_graph import DraftTreeGraphRunner
from specd.engine.params import SamplingParams
from specd.engine.scheduler import DRAFT

from test_draft_graph import MAX_TOKENS, cuda, pair  # noqa: F401  (fixtures: the tiny pairs, a CUDA device)


def tree_llm(target, draft, k=4, width=2, nodes=None, **kw):
    spec = specd.SpeculationConfig(method="draft", num_speculative_tokens=k, draft_tree_width=width,
                                   max_tree_nodes=nodes)
    return specd.LLM(target, draft, spec, **kw)


class Call(NamedTuple):
    used: bool       # the runner grew the trees
    forward0: bool   # ... forward 0 (the catch-up) included
    n: int           # requests
    ks: list         # distinct k
    counts: list     # catch-up lengths
    grown: list      # per request: (nodes grown, k)
    empty: int       # requests whose tree is the root alone


def _grown(run, model, pool, items, width, graph, monkeypatch):
    """(path probabilities, parents) of every grown node per request, and the trees of the
    item.nodes best nodes, from one run_draft_tree call (``graph`` None: the host loop, with
    the runner's attention, KernelAttention: on the CPU its reference, not torch SDPA, so
    that both compute the same logits)."""
    grown = []

    def record(its, probs, parents):
        grown.extend(zip(probs, parents))
        return [([], 0.0) for _ in its]

    with monkeypatch.context() as patch:
        if graph is None:
            real_forward = draft_tree.forward
            patch.setattr(draft_tree, "forward", lambda *a: real_forward(*a, kernel=True))
        run(model, pool, items, width, size=record, graph=graph)
        trees = run(model, pool, items, width, graph=graph)
    return grown, trees


def checked_run_draft_tree(monkeypatch, calls):
    """Every engine draft-tree call first grows the trees with the host loop and with the
    runner, without and with a sizer, and compares them: the same grown nodes (parents, and
    path probabilities within float32 rounding: the runner's forwards pad rows, which changes
    the matmuls' rounding by an ulp) and the same trees (tokens, parents, greedy chain; the
    predicted acceptance within rounding). Then it makes the engine's call through the runner."""
    real = draft_tree.run_draft_tree

    def run(model, pool, items, width, on_forward=None, size=None, graph=None, grammar=None):
        assert isinstance(graph, DraftTreeGraphRunner) and grammar is None  # the engine passes its runner
        want_grown, want = _grown(real, model, pool, items, width, None, monkeypatch)
        got_grown, got = _grown(real, model, pool, items, width, graph, monkeypatch)
        assert len(got_grown) == len(want_grown)
        for (gp, gpar), (wp, wpar) in zip(got_grown, want_grown):
            np.testing.assert_array_equal(gpar, wpar)
            np.testing.assert_allclose(gp, wp, rtol=2e-5, atol=0)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.tree.tokens, w.tree.tokens)
            np.testing.assert_array_equal(g.tree.parents, w.tree.parents)
            assert g.predicted == pytest.approx(w.predicted, rel=2e-5) and g.chain == w.chain
        calls.append(Call(graph.accepts(items), graph.accepts(items) and graph.catch_up_width(items) is not None,
                          len(items), sorted({it.k for it in items}),
                          [it.request.length - it.request.computed[DRAFT] for it in items],
                          [(len(p), it.k) for (_, p), it in zip(want_grown, items)],
                          sum(1 for _, p in want_grown if len(p) == 0)))
        return real(model, pool, items, width, on_forward, size, graph)

    monkeypatch.setattr(engine_module, "run_draft_tree", run)


@pytest.mark.parametrize("width,k,nodes", [(2, 4, None), (3, 3, 5)])
def test_engine_greedy_with_tree_graph_equals_plain_decoding(pair, monkeypatch, width, k, nodes):
    target, draft, prompts, baseline = pair
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    host = tree_llm(target, draft, k, width, nodes)
    assert host.draft_graph is None  # trees: off unless asked for
    host_outs = host.generate(prompts, greedy)
    llm = tree_llm(target, draft, k, width, nodes, draft_graph=True)
    assert isinstance(llm.draft_graph, DraftTreeGraphRunner) and llm.engine.draft_graph is llm.draft_graph
    calls = []
    checked_run_draft_tree(monkeypatch, calls)
    outs = llm.generate(prompts, greedy)
    assert [o.token_ids for o in outs] == baseline
    # The same trees, so the same acceptance as the host loop, request by request.
    assert [o.metrics.accepted_tokens for o in outs] == [o.metrics.accepted_tokens for o in host_outs]
    assert all(c.used for c in calls if max(c.ks) >= 2)
    assert any(len(c.ks) > 1 for c in calls)  # mixed k (requests near max_tokens)
    # Forward 0 in the runner. The accepted path's draft KV is kept, so catch-ups are 1 or 2
    # tokens and rarely differ within a call; the chain runner's tests (test_draft_graph.py)
    # cover the shared catch-up code with mixed widths.
    assert any(c.forward0 for c in calls)
    assert any(not c.forward0 for c in calls)  # forward 0 eager (after a prefill)


def test_padded_buckets_short_frontiers_and_empty_trees(pair, monkeypatch):
    """Sampled requests rank candidates by their own rules: top-k 1 leaves one candidate per
    node (frontiers shorter than the width: dummy rows), and a request whose candidates all
    have probability 0 (here: its rows forced to zero, as a NaN row is) verifies its root
    alone in both paths while the others grow; buckets pad the batch."""
    target, draft, prompts, _ = pair
    real_probs = draft_tree.sampling_probs

    def probs_with_a_dead_request(logits, params, cluster=False):
        probs, status = real_probs(logits, params, cluster)
        dead = params[:, 1] == 7  # top_k 7 marks the request whose rows are refused
        return torch.where(dead[:, None], 0.0, probs), status

    monkeypatch.setattr(draft_tree, "sampling_probs", probs_with_a_dead_request)
    llm = tree_llm(target, draft, 4, 3, draft_graph=True, max_num_seqs=5)
    old = llm.draft_graph
    llm.engine.draft_graph = DraftTreeGraphRunner(llm.draft, llm.pool, replace(old.config, buckets=(2, 8),
                                                                               capture=False), 3)
    calls = []
    checked_run_draft_tree(monkeypatch, calls)
    params = [SamplingParams(temperature=0.0 if i % 4 == 0 else 0.8, top_k=[0, 1, 2, 7][i % 4], top_p=0.95,
                             max_tokens=MAX_TOKENS, ignore_eos=True, seed=i) for i in range(len(prompts))]
    outs = llm.generate(prompts, params)
    assert all(len(o.token_ids) == MAX_TOKENS for o in outs)
    assert any(c.forward0 and c.n not in (2, 8) for c in calls)  # padded batches
    assert any(c.empty for c in calls)  # the dead request: root only
    # short frontiers: fewer nodes than w + (k - 1) w^2 (every frontier full), none empty
    assert any(0 < nodes < 3 + (k - 1) * 9 for c in calls for nodes, k in c.grown)
    dead = [o for i, o in enumerate(outs) if i % 4 == 3]
    assert all(o.metrics.draft_tokens == 0 for o in dead)
    assert any(o.metrics.accepted_tokens > 0 for i, o in enumerate(outs) if i % 4 != 3)


def test_goodput_sized_trees_through_the_runner(pair, monkeypatch):
    """The goodput policy picks the depth of each step's trees and sizes the grown
    trees from their path probabilities: through the runner it gets the host loop's nodes (the
    check above), and greedy outputs equal plain decoding."""
    from specd.engine.timer import GPUProfile, SyntheticTimer

    target, draft, prompts, baseline = pair
    spec = specd.SpeculationConfig(method="draft", num_speculative_tokens="auto", max_speculative_tokens=5,
                                   draft_tree_width=2)
    memory_bound = GPUProfile(target_base=0.020, target_knee=256, target_per_token=0.0002, draft_base=0.002,
                              draft_knee=256, draft_per_token=0.00002, step_overhead=0.0005)
    llm = specd.LLM(target, draft, spec, draft_graph=True, timer=SyntheticTimer(memory_bound))
    assert isinstance(llm.draft_graph, DraftTreeGraphRunner)
    calls = []
    checked_run_draft_tree(monkeypatch, calls)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outs] == baseline
    assert any(c.used for c in calls)
    assert len({k for c in calls for k in c.ks}) > 1  # the policy chose different depths
    assert sum(o.metrics.accepted_tokens for o in outs) > 0


def test_replay_rejects_a_record_that_names_no_candidate():
    """DraftTreeBuilder.replay (the runner's record into a builder) checks every frontier index
    against the candidates the forward before produced, with a clear error."""
    from specd.verification import DraftTreeBuilder

    record = np.zeros((2, 10))  # width 2: [2, 2] tokens, [2, 2] probabilities, [2] frontier
    record[:, 8:] = -1
    record[0, :2], record[0, 4:6] = [7, 8], [0.75, 0.25]
    record[1, 8] = 3  # rank 1 of frontier node 1: forward 0 had only the root
    with pytest.raises(errors.InvalidArgumentError, match="did not produce"):
        DraftTreeBuilder(5).replay(record.reshape(-1), 2, 2)
    record[1, 8] = 1
    builder = DraftTreeBuilder(5)
    chain, fed = builder.replay(record.reshape(-1), 2, 2)
    assert chain.tolist() == [0, 1] and fed.tolist() == [2, -1]  # forward 1 fed node 2 (flat 1: rank 1) first
    parents, depths, tokens, path_probs = builder.nodes()
    assert parents.tolist() == [-1, 0, 0] and depths.tolist() == [0, 1, 1] and tokens.tolist() == [5, 7, 8]
    assert path_probs.dtype == np.float64 and path_probs.tolist() == [1.0, 0.75, 0.25]


def test_tree_graph_option_errors(pair):
    target, draft, _, _ = pair
    llm = tree_llm(target, draft, 3, 2, draft_graph=True)
    with pytest.raises(errors.InvalidArgumentError, match="tree width"):
        DraftTreeGraphRunner(llm.draft, llm.pool, llm.draft_graph.config, 1)
    with pytest.raises(errors.InvalidArgumentError, match="float32 only"):
        tree_llm(target, draft, 3, 2, dtype="bfloat16", draft_graph=True)
    # A chain runner is not used for trees, nor a tree runner of another width.
    chain_runner = DraftGraphRunner(llm.draft, llm.pool, llm.draft_graph.config)
    assert not isinstance(chain_runner, DraftTreeGraphRunner)
    assert isinstance(tree_llm(target, draft, 3, 1, draft_graph=True).draft_graph, DraftGraphRunner)


def test_the_tree_runner_is_the_default_wherever_runners_are(pair, monkeypatch):
    """draft_graph=None turns the runner on where _graph_wanted says so (a supported draft on a
    CUDA device), for trees as for chains: validated on an H100 (2026-11-27), trees are no
    longer left on the host loop by default."""
    import specd.engine.llm as llm_module

    target, draft, _, _ = pair
    assert tree_llm(target, draft, 3, 2).draft_graph is None  # CPU: the host loop
    monkeypatch.setattr(llm_module, "_graph_wanted", lambda flag, model, timer: flag is None or bool(flag))
    assert isinstance(tree_llm(target, draft, 3, 2).draft_graph, DraftTreeGraphRunner)
    assert tree_llm(target, draft, 3, 2, draft_graph=False).draft_graph is None


# ---- GPU ----


def test_gpu_tree_graph_replay_equals_eager_runner_without_host_sync(pair, monkeypatch, cuda):
    """The captured graphs (the head with or without forward 0, forwards 1..k-1) record what the
    runner's eager code records, bit for bit, and a run (inputs filled and uploaded, graphs
    replayed) does not synchronise with the host; greedy outputs equal plain decoding."""
    target, draft, prompts, _ = pair
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    baseline = [o.token_ids for o in specd.LLM(target, device="cuda").generate(prompts, greedy)]
    llm = tree_llm(target, draft, 4, 3, device="cuda")  # the default on CUDA: the tree runner, captured
    runner = llm.draft_graph
    assert isinstance(runner, DraftTreeGraphRunner) and runner.capture
    eager = DraftTreeGraphRunner(llm.draft, llm.pool, replace(runner.config, capture=False), 3)
    real_run, checked = runner.run, []

    def run(items, first_logits=None, on_forward=None):
        want = eager.run(items, first_logits).clone()
        width = 0 if first_logits is not None else runner.catch_up_width(items)
        runner._graphs_for(runner.bucket(len(items)), width, max(it.k for it in items), False)  # capture
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = real_run(items, first_logits, on_forward)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert torch.equal(got, want)
        checked.append(width)
        return got

    monkeypatch.setattr(runner, "run", run)
    assert [o.token_ids for o in llm.generate(prompts, greedy)] == baseline
    sampled = SamplingParams(temperature=0.8, top_k=2, max_tokens=MAX_TOKENS, ignore_eos=True, seed=3)
    llm.generate(prompts, sampled)
    assert 0 in checked and any(w > 0 for w in checked)
