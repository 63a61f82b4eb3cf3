"""N-gram and suffix proposers through the Python API, and a model-free end-to-end check:
speculative greedy decoding with their proposals emits exactly what plain decoding emits."""

import numpy as np
import pytest

import specd
from specd import errors

WORDS = {"to": 1, "be": 2, "or": 3, "not": 4}


def ids(text):
    return [WORDS[w] for w in text.split()]


def test_to_be_or_not_to_be():
    p = specd.NgramProposer(n_max=2)
    p.add_request(0, ids("to be or not to be"))
    out = p.propose([0], max_depth=4, max_nodes=8)
    assert out.tree(0).tokens.tolist() == [WORDS["be"]] + ids("or not to be")
    assert out.tree(0).is_chain and len(out) == 1


def test_one_to_many_candidates_recent_and_frequent():
    # "a b" was followed by c twice long ago, then by d once recently.
    history = [1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 9, 1, 2]
    recent = specd.NgramProposer(n_max=2, max_candidates=2, order="recent")
    frequent = specd.NgramProposer(n_max=2, max_candidates=2, order="frequent")
    for p in (recent, frequent):
        p.add_request(5, history)
    r = recent.propose([5], max_depth=1, max_nodes=4).tree(0)
    f = frequent.propose([5], max_depth=1, max_nodes=4)
    assert r.tokens.tolist() == [2, 4, 3]  # most recent continuation first
    assert f.tree(0).tokens.tolist() == [2, 3, 4]  # most frequent first
    np.testing.assert_allclose(f.node_probs, [1, 2 / 3, 1 / 3], rtol=1e-6)


def test_batch_arguments_and_errors():
    p = specd.NgramProposer()
    p.add_request(1, [5, 6, 7, 5, 6])
    p.add_request(2, [1, 1, 1, 1])
    out = p.propose([1, 2], max_depth=[2, 3], max_nodes=[4, 0])
    assert out.offsets.tolist()[-1] == len(out.tokens)
    assert out.tree(0).tokens.tolist() == [6, 7, 5]
    assert len(out.tree(1)) == 1  # max_nodes 0: root only
    p.append(2, [1])
    assert p.history_length(2) == 5 and 2 in p
    p.truncate(1, 2)
    assert p.history_length(1) == 2
    with pytest.raises(errors.UnknownSequenceError):
        p.propose([1, 3], 2, 2)
    with pytest.raises(errors.SequenceExistsError):
        p.add_request(1, [1])
    with pytest.raises(ValueError, match="negative|>= 0"):
        p.append(1, [-4])
    with pytest.raises(ValueError, match="max_depth has 1 values"):
        p.propose([1, 2], [2], 2)
    with pytest.raises(ValueError, match="order"):
        specd.NgramProposer(order="random")
    with pytest.raises(ValueError):
        specd.NgramProposer(n_min=3, n_max=2)
    p.remove_request(1, finished=False)
    assert 1 not in p


def test_suffix_cache_shares_finished_outputs():
    for factor, want in ((1.0, [8, 9, 10]), (2.0, [8, 9, 10, 11])):
        s = specd.SuffixProposer(spec_factor=factor)
        s.add_request(1, [100, 101])
        s.append(1, [7, 8, 9, 10, 11])  # generated output
        s.remove_request(1, finished=True)
        assert s.cache_tokens > 0
        s.add_request(2, [55, 7, 8])  # has never seen 9, 10, 11
        # budget = min(max_nodes, ceil(spec_factor * match length 2))
        assert s.propose([2], max_depth=3, max_nodes=3).tree(0).tokens.tolist() == want
    aborted = specd.SuffixProposer()
    aborted.add_request(1, [100, 101])
    aborted.append(1, [7, 8, 9])
    aborted.remove_request(1, finished=False)
    assert aborted.cache_tokens == 0


# ---- end to end at the model-free level ----

VOCAB = 11


def toy_next(context):
    """A deterministic 'target model': the next token depends on the last two tokens."""
    return (3 * context[-1] + 5 * context[-2] + 1) % VOCAB


def plain_greedy(prompt, n):
    seq = list(prompt)
    while len(seq) < len(prompt) + n:
        seq.append(toy_next(seq))
    return seq[len(prompt):]


def speculative_greedy(proposer, prompt, n):
    proposer.add_request(0, prompt)
    seq, steps = list(prompt), 0
    while len(seq) < len(prompt) + n:
        tree = proposer.propose([0], max_depth=6, max_nodes=12).tree(0)
        rows = np.zeros((len(tree), VOCAB), dtype=np.float32)
        for v in range(len(tree)):  # the target's row for node v: the context ends with v's path
            path, node = [], v
            while node > 0:
                path.append(int(tree.tokens[node]))
                node = int(tree.parents[node])
            rows[v, toy_next(seq + path[::-1])] = 1
        out = specd.verify_greedy(rows, tree)
        seq.extend(out.tokens.tolist())
        proposer.append(0, out.tokens)
        steps += 1
    return seq[len(prompt):len(prompt) + n], steps


@pytest.mark.parametrize("make", [lambda: specd.NgramProposer(n_max=3), lambda: specd.SuffixProposer()],
                         ids=["ngram", "suffix"])
def test_speculative_greedy_equals_plain_greedy(make):
    prompt = [1, 2, 3, 4, 5]
    want = plain_greedy(prompt, 300)
    got, steps = speculative_greedy(make(), prompt, 300)
    assert got == want
    assert steps < 150  # the toy model cycles, so proposals are accepted: > 2 tokens per step
