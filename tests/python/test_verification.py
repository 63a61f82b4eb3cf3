"""Token trees, sampling rules and verification through the Python API."""

import numpy as np
import pytest
import torch
from scipy import stats

import specd
from specd import errors


def hot(token, vocab=5):
    row = np.zeros(vocab, dtype=np.float32)
    row[token] = 1
    return row


# ---------------------------------------------------------------- token trees

def test_tree_construction_and_views():
    t = specd.TokenTree(9)
    a = t.add_node(0, 1)
    b = t.add_node(0, 2)
    t.add_node(a, 3)
    t.add_node(b, 4)
    assert len(t) == 5 and t.num_drafts == 4 and t.max_depth == 2 and not t.is_chain
    assert t.tokens.tolist() == [9, 1, 2, 3, 4]
    assert t.parents.tolist() == [-1, 0, 0, 1, 2]
    assert t.depths.tolist() == [0, 1, 1, 2, 2]
    assert t.ancestor_mask().tolist() == [[0b1], [0b11], [0b101], [0b1011], [0b10101]]
    assert t.paths().tolist() == [[0, 1, 3], [0, 2, 4]]
    assert t.leaves().tolist() == [3, 4]
    assert t.find_child(0, 2) == 2 and t.find_child(0, 7) == -1
    with pytest.raises(ValueError, match="node 5"):
        t.add_node(5, 1)


def test_tree_builders():
    assert specd.TokenTree.chain(0, [4, 5]).is_chain
    t = specd.TokenTree.from_candidates(0, [[1, 2, 3], [1, 2, 4], [5]], max_nodes=4)
    assert t.tokens.tolist() == [0, 1, 2, 3, 4]
    t = specd.TokenTree.from_parents([7, 1, 2], [-1, 0, 0])
    assert t.parents.tolist() == [-1, 0, 0]
    with pytest.raises(ValueError, match="parents must precede"):
        specd.TokenTree.from_parents([7, 1, 2], [-1, 2, 0])
    wide = specd.TokenTree.chain(0, list(range(70)))
    mask = wide.ancestor_mask()
    assert mask.shape == (71, 2) and mask.dtype == np.uint64
    assert int(mask[70, 0]) == 2**64 - 1 and int(mask[70, 1]) == 2**7 - 1


def test_draft_tree_builder():
    b = specd.DraftTreeBuilder(0)
    b.expand(0, [1, 2, 3], [0.6, 0.3, 0.1])
    b.expand(1, [4, 5], [0.9, 0.1])
    assert b.frontier(1).tolist() == [4]
    tree, kept, probs = b.build(3)
    assert tree.tokens.tolist() == [0, 1, 4, 2]
    assert kept.tolist() == [0, 1, 4, 2]
    np.testing.assert_allclose(probs, [1, 0.6, 0.54, 0.3], rtol=1e-6)
    with pytest.raises(errors.FailedPreconditionError):
        b.expand(0, [7], [0.5])


# ---------------------------------------------------------------- sampling rules

def reference_probs(logits, temperature, top_k, top_p, min_p):
    """Independent numpy statement of the rules in sampling.h."""
    logits = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        out = np.zeros_like(logits)
        out[np.argmax(logits)] = 1
        return out
    p = np.exp((logits - logits.max()) / temperature)
    p /= p.sum()
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))
    if 0 < top_k < len(p):
        p[order[top_k:]] = 0
        order = order[:top_k]
        p /= p.sum()
    if top_p < 1:
        cum, keep = 0.0, 0
        while keep < len(order) and (keep == 0 or cum < top_p):
            cum += p[order[keep]]
            keep += 1
        p[order[keep:]] = 0
        p /= p.sum()
    if min_p > 0:
        p[p < min_p * p.max()] = 0
        p /= p.sum()
    return p


def test_sampling_probs_match_an_independent_reference():
    rng = np.random.default_rng(0)
    for _ in range(300):
        vocab = int(rng.integers(2, 40))
        logits = (rng.normal(size=vocab) * rng.uniform(0.5, 4)).astype(np.float32)
        params = dict(temperature=float(rng.choice([0, 0.3, 0.7, 1.0, 1.8])),
                      top_k=int(rng.choice([0, 1, 3, 10])),
                      top_p=float(rng.choice([1.0, 0.95, 0.6, 0.2])),
                      min_p=float(rng.choice([0.0, 0.05, 0.3])))
        got = specd.sampling_probs(logits, **params)
        np.testing.assert_allclose(got, reference_probs(logits, **params), atol=1e-6, err_msg=str(params))


def test_sampling_probs_shapes_types_and_errors():
    logits = np.random.default_rng(1).normal(size=(3, 7)).astype(np.float32)
    out = specd.sampling_probs(logits, top_p=0.9)
    assert out.shape == (3, 7) and out.dtype == np.float32
    np.testing.assert_allclose(out.sum(axis=1), 1, rtol=1e-6)
    t = specd.sampling_probs(torch.from_numpy(logits[0]), temperature=0.5)
    assert isinstance(t, torch.Tensor) and t.shape == (7,)
    for bad, match in [(dict(temperature=-1), "temperature"), (dict(top_p=0.0), "top_p"),
                       (dict(top_k=-2), "top_k"), (dict(min_p=2.0), "min_p")]:
        with pytest.raises(ValueError, match=match):
            specd.sampling_probs(logits, **bad)
    with pytest.raises(ValueError, match="NaN|nan"):
        specd.sampling_probs(np.array([0.0, np.nan], dtype=np.float32))


# ---------------------------------------------------------------- verification

def test_greedy_worked_examples():
    tree = specd.TokenTree.chain(0, [1, 2, 3])
    all_ok = specd.verify_greedy(np.stack([hot(1), hot(2), hot(3), hot(4)]), tree)
    assert all_ok.tokens.tolist() == [1, 2, 3, 4] and all_ok.num_accepted == 3
    assert all_ok.path.tolist() == [0, 1, 2, 3]
    none = specd.verify_greedy(np.stack([hot(4), hot(2), hot(3), hot(4)]), tree)
    assert none.tokens.tolist() == [4] and none.num_accepted == 0
    tie = np.array([0.1, 0.4, 0.4, 0.1, 0.0], dtype=np.float32)
    assert specd.verify_greedy(np.stack([tie, hot(0)]), specd.TokenTree.chain(0, [2])).tokens.tolist() == [1]
    tree = specd.TokenTree.from_parents([0, 1, 2, 4], [-1, 0, 0, 2])
    out = specd.verify_greedy(torch.from_numpy(np.stack([hot(2), hot(0), hot(4), hot(3)])), tree)
    assert out.tokens.tolist() == [2, 4, 3] and out.path.tolist() == [0, 2, 3]


def test_greedy_from_target_tokens_matches_rows():
    rng = np.random.default_rng(4)
    tree = specd.TokenTree.from_parents([0, 1, 2, 3, 1], [-1, 0, 0, 1, 3])
    for _ in range(50):
        rows = rng.integers(0, 3, size=(len(tree), 4)).astype(np.float32)
        a = specd.verify_greedy(rows, tree)
        b = specd.verify_greedy_tokens(torch.from_numpy(rows).argmax(-1), tree)
        c = specd.verify_greedy_tokens(rows.argmax(-1), tree)
        assert a.tokens.tolist() == b.tokens.tolist() == c.tokens.tolist()
        assert a.path.tolist() == c.path.tolist()


def test_stochastic_verification_is_reproducible_and_validates():
    p = np.array([0.3, 0.2, 0.2, 0.2, 0.1], dtype=np.float32)
    q = np.array([0.1, 0.1, 0.2, 0.3, 0.3], dtype=np.float32)
    tree = specd.TokenTree.from_parents([0, 3, 4], [-1, 0, 0])
    target, draft = np.stack([p, p, p]), np.stack([q, q, q])
    a = specd.verify(target, tree, draft, seed=5, request=1, step=2, position=30)
    b = specd.verify(target, tree, draft, seed=5, request=1, step=2, position=30)
    assert a.tokens.tolist() == b.tokens.tolist() and a.path.tolist() == b.path.tolist()
    assert specd.sample(p, seed=1, position=4) == specd.verify(p[None], specd.TokenTree(0), seed=1, position=4).tokens[0]
    with pytest.raises(ValueError, match="draft_sampling"):
        specd.verify(target, tree, draft, seed=1, draft_sampling="sometimes")
    with pytest.raises(ValueError, match="one row per node"):
        specd.verify(target[:2], tree, seed=1)
    with pytest.raises(ValueError, match="draft probability 0"):
        specd.verify(target, tree, np.stack([hot(0)] * 3), seed=1)
    with pytest.raises(ValueError, match="TokenTree"):
        specd.verify(target, [0, 3, 4], seed=1)
    bad = target.copy()
    bad[0, 1] = np.nan
    with pytest.raises(ValueError, match="finite"):
        specd.verify(bad, tree, seed=1)


def test_tree_verification_is_lossless_through_the_python_api():
    """100,000 draws: 3 distinct siblings sampled from q, first emitted token ~ p (chi-square)."""
    rng = np.random.default_rng(3)
    vocab = 8
    p = specd.sampling_probs(rng.normal(size=vocab).astype(np.float32) * 1.5)
    q = specd.sampling_probs(rng.normal(size=vocab).astype(np.float32) * 1.5)
    p[-1] = 0  # a token the target never emits
    p /= p.sum()
    counts = np.zeros(vocab, dtype=np.int64)
    target, draft = np.stack([p] * 4), np.stack([q] * 4)
    trials = 100_000
    # Gumbel-top-3 = three draws from q without replacement, for all trials at once.
    keys = np.log(q.astype(np.float64)) + rng.gumbel(size=(trials, vocab))
    siblings = np.argsort(-keys, axis=1)[:, :3]
    for trial in range(trials):
        tree = specd.TokenTree.from_parents([0, *siblings[trial]], [-1, 0, 0, 0])
        counts[specd.verify(target, tree, draft, seed=11, request=trial).tokens[0]] += 1
    assert counts[-1] == 0
    pe = p[:-1].astype(np.float64)
    assert stats.chisquare(counts[:-1], pe / pe.sum() * counts.sum()).pvalue > 0.001
