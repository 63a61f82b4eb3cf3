"""Structured outputs on the proposing side (engine/grammar_drafts.py): model-free trees are
pruned to the paths the grammar accepts, the draft model's rows are masked as the target's
are. Checked against fresh matchers on random trees and paths; in the engine every verified
draft follows the grammar, outputs equal those with both off, and a draft identical to the
target is always accepted (without the masks it almost never is)."""

import numpy as np
import pytest
import torch

import specd
import xgrammar as xgr
from specd.engine import engine as engine_module
from specd.engine.grammar_drafts import DraftGrammar, forced_tokens, prune_tree, with_forced
from specd.engine.structured_outputs import GrammarMasks
from random_trees import path_of, random_tree

SO = specd.StructuredOutputsParams
SCHEMA = {"type": "object", "properties": {"size": {"enum": ["S", "M", "L"]}, "name": {"type": "string", "maxLength": 6},
                                            "ok": {"type": "boolean"}},
          "required": ["size", "name", "ok"], "additionalProperties": False}
CONSTRAINTS = {"json": SO(json=SCHEMA), "regex": SO(regex=r"[0-9]{3}-[a-z]{2,5}"),
               "choice": SO(choice=["yes", "no", "maybe later"])}
PROMPTS = ["def f(x):\n    return", "The answer is", '{"size": "M", "name": "ab", "ok": true} {"size":', "12-ab 345-"]
METHODS = {"ngram": {}, "suffix": {}, "draft": {}, "draft-tree": {"draft_tree_width": 2}}
REGEX = r"[0-9]{2,6}(-[a-z]{1,3})?"


def make_llm(target, draft, method, k=4):
    name = "draft" if method.startswith("draft") else method
    return specd.LLM(target, draft if name == "draft" else None,
                     specd.SpeculationConfig(method=name, num_speculative_tokens=k, **METHODS[method]))


def walk(grammar, prefix, path) -> str:
    """What a fresh matcher makes of ``path`` after ``prefix``: "ok" (accepted, the grammar
    still open), "free" (the grammar ended on the way: unconstrained from there), "no"."""
    m = xgr.GrammarMatcher(grammar)
    assert all(m.accept_token(t) for t in prefix)
    for t in path:
        if m.is_terminated():
            return "free"
        if not m.accept_token(int(t)):
            return "no"
    return "free" if m.is_terminated() else "ok"


def same_mask(matcher, grammar, accepted, vocab) -> bool:
    """Whether ``matcher`` allows what a fresh matcher does after ``accepted``."""
    fresh = xgr.GrammarMatcher(grammar)
    assert all(fresh.accept_token(t) for t in accepted)
    got, want = xgr.allocate_token_bitmask(1, vocab), xgr.allocate_token_bitmask(1, vocab)
    matcher.fill_next_token_bitmask(got, 0)
    fresh.fill_next_token_bitmask(want, 0)
    return torch.equal(got, want)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir, tiny_llama_draft_dir):
    return make_llm(tiny_llama_dir, tiny_llama_draft_dir, "draft")


def test_prune_tree_keeps_exactly_the_paths_a_fresh_matcher_accepts(llm):
    """Random trees of digits, letters, '-', EOS (the grammar's stop token: below it nothing
    is constrained) and random tokens: a node stays iff its path is accepted or passes the
    grammar's end; the kept tree is the original's restriction; the matcher ends where it
    started."""
    grammar = llm._grammars.compile(SO(regex=REGEX))
    vocab = llm.target.config.vocab_size
    tok = llm.tokenizer
    alphabet = [tok.convert_tokens_to_ids(c) for c in "0123456789-ab"] + [0]
    prefix = [tok.convert_tokens_to_ids("4")]
    rng = np.random.default_rng(0)
    pruned = unchanged = 0
    for _ in range(60):
        parents, tokens = random_tree(rng, alphabet, vocab, int(rng.integers(2, 14)))
        tree = specd.TokenTree.from_parents(np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32))
        want = [n for n in range(len(tokens)) if n == 0 or walk(grammar, prefix, path_of(parents, tokens, n)) != "no"]
        matcher = xgr.GrammarMatcher(grammar)
        matcher.accept_token(prefix[0])
        got = prune_tree(matcher, tree)
        if got is None:
            unchanged += 1
            assert want == list(range(len(tokens)))
        else:
            pruned += 1
            out, kept = got
            assert sorted(kept.tolist()) == want and kept[0] == 0
            position = {int(old): new for new, old in enumerate(kept)}
            assert list(out.tokens) == [tokens[v] for v in kept]
            assert list(out.parents) == [-1] + [position[parents[v]] for v in kept[1:]]
        assert same_mask(matcher, grammar, prefix, vocab), "the walk moved the matcher"
    assert pruned > 10 and unchanged > 3, (pruned, unchanged)


def test_draft_grammar_masks_each_row_as_a_fresh_matcher(llm):
    """DraftGrammar.mask over a random sequence of (row, request, path), two requests at
    different outputs, rows wider than the grammar's vocabulary (a draft's): each masked row
    equals a fresh matcher's mask after output + path (columns past the vocabulary -inf); a
    refused or ended path leaves its row as it was; close() returns each matcher to its
    output."""
    grammar_params = SO(regex=REGEX)
    vocab = llm.target.config.vocab_size
    tok = llm.tokenizer
    digits = [tok.convert_tokens_to_ids(c) for c in "0123456789"]
    dash, a = tok.convert_tokens_to_ids("-"), tok.convert_tokens_to_ids("a")
    reqs = llm._requests(["x", "y"], specd.SamplingParams(structured_outputs=grammar_params))
    reqs[1].output_ids.extend([digits[1], digits[2], digits[3]])
    masks = GrammarMasks()
    draft_grammar = DraftGrammar(masks)
    rng = np.random.default_rng(1)
    width = vocab + 7
    checked = {"masked": 0, "left": 0}
    for _ in range(40):
        rows = []
        for row in range(int(rng.integers(1, 5))):
            req = reqs[int(rng.integers(0, 2))]
            path = [int(rng.choice(digits + [dash, a, 0])) for _ in range(int(rng.integers(0, 5)))]
            rows.append((row, req, path))
        logits = torch.from_numpy(rng.standard_normal((len(rows) + 1, width)).astype(np.float32))
        before = logits.clone()
        draft_grammar.mask(logits, rows)
        assert torch.equal(logits[len(rows)], before[len(rows)])  # a row nobody asked for
        for row, req, path in rows:
            state = walk(req.grammar, req.output_ids, path)
            if state != "ok":
                assert torch.equal(logits[row], before[row]), (state, path)
                checked["left"] += 1
                continue
            fresh = xgr.GrammarMatcher(req.grammar)
            assert all(fresh.accept_token(t) for t in req.output_ids + path)
            want = xgr.allocate_token_bitmask(1, vocab)
            fresh.fill_next_token_bitmask(want, 0)
            bits = ((want[0].numpy()[:, None] >> np.arange(32)) & 1).astype(bool).reshape(-1)[:vocab]
            expected = before[row].clone()
            expected[:vocab][~torch.from_numpy(bits)] = float("-inf")
            expected[vocab:] = float("-inf")
            assert torch.equal(logits[row], expected), (path, torch.nonzero(logits[row] != expected)[:5])
            checked["masked"] += 1
    assert checked["masked"] > 20 and checked["left"] > 5, checked
    draft_grammar.close()
    for req in reqs:
        assert same_mask(masks.matcher(req), req.grammar, req.output_ids, vocab)


def recording(monkeypatch):
    """Records, per verify step, each constrained request's output so far and its tree."""
    seen = []
    original = engine_module.Engine._propose

    def propose(self, items, prefix_tokens=0):
        trees, dists, on_device = original(self, items, prefix_tokens)
        for it in items:
            req = it.request
            if req.params.structured_outputs is not None:
                tree = trees[req.id]
                seen.append((req.grammar, list(req.output_ids), list(tree.parents), list(tree.tokens)))
        return trees, dists, on_device

    monkeypatch.setattr(engine_module.Engine, "_propose", propose)
    return seen


@pytest.mark.parametrize("method", list(METHODS))
def test_every_verified_draft_follows_the_grammar(tiny_llama_dir, tiny_llama_draft_dir, monkeypatch, method):
    """With constrain_drafts every draft of every verified tree is one the grammar allows after
    the output and the drafts above it; outputs equal those of an engine with it off, which
    verifies drafts the grammar rules out."""
    seen = recording(monkeypatch)
    outputs, bad = {}, {}
    for on in (True, False):
        llm = make_llm(tiny_llama_dir, tiny_llama_draft_dir, method)
        llm.engine.constrain_drafts = on
        seen.clear()
        outputs[on] = [llm.generate(PROMPTS, specd.SamplingParams(temperature=0.0, max_tokens=40,
                                                                  structured_outputs=so))
                       for so in CONSTRAINTS.values()]
        drafts = bad[on] = 0
        for grammar, output, parents, tokens in seen:
            for node in range(1, len(tokens)):
                drafts += 1
                bad[on] += walk(grammar, output, path_of(parents, tokens, node)) == "no"
        assert drafts, "nothing was drafted"
    assert [[o.token_ids for o in outs] for outs in outputs[True]] == \
           [[o.token_ids for o in outs] for outs in outputs[False]]
    assert bad[True] == 0
    assert bad[False] > 0, "the test drafts nothing the grammar rules out: it checks nothing"


def test_an_identical_draft_is_accepted_under_a_grammar(tiny_llama_dir):
    """The target as its own draft (greedy chains, forced tokens off): its masked rows
    propose what the target's masked rows pick, so (nearly) every draft is accepted;
    unmasked, it proposes what the grammar forbids."""
    rates = {}
    for on in (True, False):
        llm = specd.LLM(tiny_llama_dir, tiny_llama_dir, specd.SpeculationConfig(method="draft", num_speculative_tokens=4))
        llm.engine.constrain_drafts = on
        llm.engine.forced_drafts = False
        drafted = accepted = 0
        for so in CONSTRAINTS.values():
            for o in llm.generate(PROMPTS, specd.SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=so)):
                drafted += o.metrics.draft_tokens
                accepted += o.metrics.accepted_tokens
        rates[on] = accepted / drafted
    assert rates[True] >= 0.95 and rates[False] <= 0.3, rates


def test_the_goodput_policy_probes_constrained_trees(tiny_llama_dir):
    """The goodput policy sizes model-free trees from their node probabilities: a constrained
    request's are those of its tree as verified (the grammar's forced tokens, certain, then
    the proposer's nodes the grammar allows), computed here from a fresh matcher; greedy
    outputs still equal plain decoding's."""
    llm = specd.LLM(tiny_llama_dir, None, specd.SpeculationConfig(method="ngram", num_speculative_tokens=4),
                    policy="goodput")
    engine = llm.engine
    real, checked = engine.scheduler.probe, {"pruned": 0, "forced": 0}

    def probe(batch):
        real(batch)
        for s in batch:
            probs = (s.node_probs or {}).get("ngram")
            if probs is None or s.request.params.structured_outputs is None:
                continue
            tree = engine.proposers["ngram"].propose([s.request.id], [s.k_max], [s.k_max]).tree(0)
            fresh = xgr.GrammarMatcher(s.request.grammar)
            assert all(fresh.accept_token(t) for t in s.request.output_ids)
            forced = forced_tokens(fresh, s.k_max)
            pruned = prune_tree(fresh, tree)
            base = tree if pruned is None else pruned[0]
            merged, source = with_forced(base, forced, s.k_max)
            assert len(probs) == len(merged) - 1 and int(np.sum(probs == 1.0)) >= len(forced)
            checked["pruned"] += len(tree) - len(base)
            checked["forced"] += len(forced)
    engine.scheduler.probe = probe
    for so in CONSTRAINTS.values():
        params = specd.SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=so)
        want = specd.LLM(tiny_llama_dir).generate(PROMPTS, params)
        assert [o.token_ids for o in llm.generate(PROMPTS, params)] == [o.token_ids for o in want]
    assert checked["pruned"] > 0 and checked["forced"] > 0, checked


def test_forced_tokens_spell_the_grammars_forced_continuation(llm):
    """At the start of a JSON schema's output the grammar forces the text up to the first
    field's value (xgrammar orders the fields); forced_tokens spells a prefix of it that a fresh matcher accepts, at most
    ``limit`` tokens, and leaves the matcher where it was. An open choice forces nothing."""
    grammar = llm._grammars.compile(SO(json=SCHEMA))
    vocab = llm.target.config.vocab_size
    matcher = xgr.GrammarMatcher(grammar)
    text = matcher.find_jump_forward_string()
    assert text.startswith('{"') and text.rstrip('"').endswith('": ') or text.endswith('":'), text
    tokens = forced_tokens(matcher, 100)
    assert tokens and text.startswith(llm.tokenizer.decode(tokens))
    assert same_mask(matcher, grammar, [], vocab)
    fresh = xgr.GrammarMatcher(grammar)
    assert all(fresh.accept_token(t) for t in tokens)
    assert forced_tokens(matcher, 2) == tokens[:2] and forced_tokens(matcher, 0) == []
    assert forced_tokens(xgr.GrammarMatcher(llm._grammars.compile(SO(choice=["yes", "no"]))), 8) == []


def test_with_forced_puts_the_chain_first_and_keeps_the_trees_paths():
    rng = np.random.default_rng(4)
    for _ in range(200):
        parents, tokens = random_tree(rng, list(range(5)), 40, int(rng.integers(1, 12)))
        tree = specd.TokenTree.from_parents(np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32))
        forced = rng.integers(0, 5, int(rng.integers(0, 5))).tolist()
        budget = int(rng.integers(1, 16))
        out, source = with_forced(tree, forced, budget)
        got_parents, got_tokens = list(out.parents), list(out.tokens)
        assert len(got_tokens) - 1 <= budget and len(source) == len(got_tokens) and source[0] == 0
        chain = forced[:budget]
        assert [path_of(got_parents, got_tokens, i) for i in range(1, len(chain) + 1)] == \
               [chain[:i] for i in range(1, len(chain) + 1)]
        assert all(s == -1 for s in source[1:len(chain) + 1])
        paths = {tuple(path_of(got_parents, got_tokens, n)) for n in range(len(got_tokens))}
        for n in range(1, len(got_tokens)):
            if source[n] >= 0:
                assert path_of(got_parents, got_tokens, n) == path_of(parents, tokens, int(source[n]))
        if len(set(map(tuple, [path_of(parents, tokens, n) for n in range(1, len(tokens))])) | set(
                tuple(chain[:i]) for i in range(1, len(chain) + 1))) <= budget:
            # room for everything: every path of the tree is in the new one
            assert all(tuple(path_of(parents, tokens, n)) in paths for n in range(len(tokens)))


def test_a_forced_output_is_drafted_and_accepted(tiny_llama_dir):
    """A one-string choice forces the whole output: with n-gram speculation (k = 4) the
    forced tokens are drafted every step and accepted, so the output takes fewer steps than
    without forced drafts; the output is the same."""
    params = specd.SamplingParams(temperature=0.0, max_tokens=40,
                                  structured_outputs=SO(choice=["maybe later, or never at all"]))
    steps = {}
    for on in (True, False):
        llm = make_llm(tiny_llama_dir, None, "ngram")
        llm.engine.constrain_drafts = on
        out = llm.generate(["Well?"], params)[0]
        assert out.text == "maybe later, or never at all" and out.finish_reason == "stop"
        steps[on] = out.metrics.verify_steps
        if on:
            assert out.metrics.accepted_tokens >= 0.5 * out.metrics.draft_tokens > 0  # (other spellings exist)
    assert steps[True] * 2 <= steps[False], steps


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_chains_start_with_the_forced_tokens(tiny_llama_dir, tiny_llama_draft_dir, monkeypatch, checked_steps,
                                                  temperature):
    """A constrained request's draft-model chain starts with the tokens its grammar forces (up
    to k), fed in the draft's first forward: fewer draft forwards for the same outputs as
    with forced tokens off (greedy, and seeded sampling, whose forced drafts carry one-hot
    draft distributions), and the draft's KV stays consistent (check_kv after every step)."""
    params = specd.SamplingParams(temperature=temperature, seed=4, max_tokens=40, structured_outputs=SO(json=SCHEMA))
    seen = recording(monkeypatch)
    runs = {}
    for forced in (True, False):
        llm = make_llm(tiny_llama_dir, tiny_llama_draft_dir, "draft")
        llm.engine.forced_drafts = forced
        seen.clear()
        outs = llm.generate(PROMPTS, params)
        leading = 0  # drafts of verified chains that equal the grammar's forced tokens from their root
        for grammar, output, parents, tokens in seen:
            fresh = xgr.GrammarMatcher(grammar)
            assert all(fresh.accept_token(t) for t in output)
            want = fresh.find_jump_forward_tokens()[:len(tokens) - 1] if not fresh.is_terminated() else []
            leading += len(want) if tokens[1:1 + len(want)] == want else 0
        runs[forced] = ([o.token_ids for o in outs], llm.engine.timings.draft_forwards, leading)
    if temperature == 0.0:
        assert runs[True][0] == runs[False][0]
    assert runs[True][1] < runs[False][1], runs
    assert runs[True][2] > 0


def test_sampled_chains_with_forced_tokens_draw_the_constrained_distribution(tiny_llama_dir, tiny_llama_draft_dir,
                                                                            monkeypatch):
    """Choices that share long forced stretches (" return " after "a"), sampled at
    temperature 1.5 with draft-model chains that start with forced tokens
    (one-hot draft distributions): 600 draws against 600 of plain decoding, a two-sample
    chi-square test over the token sequences (the vocabulary spells a choice several ways:
    which spelling comes is part of the distribution); forced tokens were drafted."""
    from scipy import stats

    # (spelt in several ways by the tiny vocabulary: " return", " re" + "turn", " self", "sel" ...)
    so = SO(choice=["a return self.line", "a return None", "hunks", "a return self"])
    seen = recording(monkeypatch)
    counts = {}
    for method in ("none", "draft"):
        llm = make_llm(tiny_llama_dir, tiny_llama_draft_dir, method, k=3) if method == "draft" else \
            specd.LLM(tiny_llama_dir, None, specd.SpeculationConfig(method="none", jump_forward_tokens=0))
        params = [specd.SamplingParams(temperature=1.5, max_tokens=24, seed=1000 * (method == "draft") + i,
                                       structured_outputs=so) for i in range(600)]
        seen.clear()
        outs = llm.generate(["Pick:"] * 600, params)
        assert all(o.text in so.choice for o in outs)
        counts[method] = [tuple(o.token_ids) for o in outs]  # spellings count: token sequences, not texts
    forced = 0
    for grammar, output, parents, tokens in seen:
        fresh = xgr.GrammarMatcher(grammar)
        assert all(fresh.accept_token(t) for t in output)
        want = fresh.find_jump_forward_tokens()[:len(tokens) - 1] if not fresh.is_terminated() else []
        forced += bool(want) and tokens[1:1 + len(want)] == want
    assert forced > 100, f"forced tokens were drafted in {forced} verify steps only"
    kinds = sorted(set(counts["none"]) | set(counts["draft"]))
    table = np.array([[c.count(kind) for kind in kinds] for c in (counts["none"], counts["draft"])])
    common = table.sum(0) >= 10  # sequences seen 10 times or more; the rest pooled
    table = np.concatenate([table[:, common], table[:, ~common].sum(1, keepdims=True)], axis=1)
    table = table[:, table.sum(0) > 0]
    assert table.shape[1] >= 3, f"a degenerate distribution: {table}"
    _, p, _, _ = stats.chi2_contingency(table)
    assert p > 1e-3, f"speculative draws differ from plain ones: {table} (p = {p:.2g})"
