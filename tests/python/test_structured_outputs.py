"""Structured outputs (SamplingParams.structured_outputs, xgrammar) on tiny models: outputs
follow a choice, a regex, a JSON schema, any JSON object or an EBNF grammar with every
proposer; greedy speculation equals plain decoding token for token under each constraint;
sampled speculation draws from the constrained distribution (two-sample chi-square against
plain decoding); the tree masks equal a fresh matcher's after each path; bad constraints
fail before anything runs and a request whose constraint cannot go on fails alone."""

import json
import re

import numpy as np
import pytest
from scipy import stats

import specd
import xgrammar as xgr
from random_trees import path_of, random_tree
from specd.engine.structured_outputs import GrammarMasks, _fill_tree, apply_bitmask_torch

SO = specd.StructuredOutputsParams
SCHEMA = {"type": "object", "properties": {"size": {"enum": ["S", "M", "L"]}, "name": {"type": "string", "maxLength": 6},
                                            "ok": {"type": "boolean"}},
          "required": ["size", "name", "ok"], "additionalProperties": False}
CONSTRAINTS = {
    "choice": SO(choice=["yes", "no", "maybe later", "a.b*c"]),
    "regex": SO(regex=r"[0-9]{3}-[a-z]{2,5}"),
    "json": SO(json=SCHEMA),
    "json_object": SO(json_object=True),
    "grammar": SO(grammar='root ::= "(" [0-9]+ ("+" [0-9]+)* ")"'),
}
METHODS = {"none": {}, "ngram": {}, "suffix": {}, "draft": {}, "draft-tree": {"draft_tree_width": 2}}


def follows(kind: str, text: str) -> bool:
    if kind == "choice":
        return text in CONSTRAINTS["choice"].choice
    if kind == "regex":
        return re.fullmatch(r"[0-9]{3}-[a-z]{2,5}", text) is not None
    if kind == "grammar":
        return re.fullmatch(r"\(\d+(\+\d+)*\)", text) is not None
    # (strict=False: xgrammar 0.2.9's JSON grammar lets raw control characters into strings.)
    value = json.loads(text, strict=False)
    if kind == "json_object":
        return isinstance(value, dict)
    return (set(value) == {"size", "name", "ok"} and value["size"] in ("S", "M", "L")
            and isinstance(value["ok"], bool) and isinstance(value["name"], str) and len(value["name"]) <= 6)


@pytest.fixture(scope="module")
def setup(tiny_llama_dir, tiny_llama_draft_dir):
    return tiny_llama_dir, tiny_llama_draft_dir


def make_llm(target, draft, method):
    spec = dict(METHODS[method])
    name = "draft" if method.startswith("draft") else method
    return specd.LLM(target, draft if name == "draft" else None,
                     specd.SpeculationConfig(method=name, num_speculative_tokens=3, **spec))


PROMPTS = ["def f(x):\n    return", "The answer is", '{"id": 1, "name": "ab", "ok": true} {"id":', "12-ab 345-"]


@pytest.fixture(scope="module")
def plain_outputs(setup):
    target, draft = setup
    llm = make_llm(target, draft, "none")
    out = {}
    for kind, so in CONSTRAINTS.items():
        params = specd.SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=so)
        out[kind] = llm.generate(PROMPTS, params)
    return out


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_plain_outputs_follow_the_constraint(setup, plain_outputs, kind):
    """Every output is accepted token by token by a fresh matcher of its grammar; those that
    ended ("stop": EOS once the grammar was complete) are complete matches."""
    target, draft = setup
    grammar = make_llm(target, draft, "none")._grammars.compile(CONSTRAINTS[kind])
    stopped = 0
    for o in plain_outputs[kind]:
        matcher = xgr.GrammarMatcher(grammar)
        assert all(matcher.accept_token(t) for t in o.token_ids), (kind, o.text)
        if o.finish_reason == "stop":
            stopped += 1
            assert matcher.is_terminated() and follows(kind, o.text), (kind, o.text)
    # (A random model rarely closes an open-ended JSON object within 48 tokens.)
    assert stopped >= (0 if kind == "json_object" else 2), f"{kind}: too few outputs ended to check them whole"


@pytest.mark.parametrize("method", [m for m in METHODS if m != "none"])
def test_greedy_speculation_under_constraints_equals_plain(setup, plain_outputs, method):
    target, draft = setup
    llm = make_llm(target, draft, method)
    drafted = 0
    for kind, so in CONSTRAINTS.items():
        params = specd.SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=so)
        outs = llm.generate(PROMPTS, params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain_outputs[kind]], kind
        drafted += sum(o.metrics.draft_tokens for o in outs)
    assert drafted > 0, "nothing was drafted: speculation was not exercised"


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_a_batch_mixing_constrained_and_free_requests(setup, method):
    """Constrained requests between unconstrained ones (their rows are not the batch's first):
    each output is what it is alone under plain decoding."""
    target, draft = setup
    free = specd.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    params = [free, specd.SamplingParams(temperature=0.0, max_tokens=24, structured_outputs=CONSTRAINTS["regex"]),
              free, specd.SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=CONSTRAINTS["json"])]
    plain = make_llm(target, draft, "none")
    want = [plain.generate([p], sp)[0].token_ids for p, sp in zip(PROMPTS, params)]
    outs = make_llm(target, draft, method).generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == want
    assert follows("regex", outs[1].text) and outs[3].finish_reason in ("stop", "length")


def test_sampled_speculation_draws_the_constrained_distribution(setup):
    """A choice sampled at temperature 1.5 (so no string is certain): 600 speculative draws
    against 600 plain ones, a two-sample chi-square test."""
    target, draft = setup
    so = SO(choice=["yes", "no", "maybe", "none of these"])
    counts = {}
    for method in ("none", "draft"):
        llm = make_llm(target, draft, method)
        params = [specd.SamplingParams(temperature=1.5, max_tokens=24, seed=1000 * (method == "draft") + i,
                                       structured_outputs=so) for i in range(600)]
        texts = [o.text for o in llm.generate(["Pick one:"] * 600, params)]
        assert all(t in so.choice for t in texts)
        counts[method] = [texts.count(c) for c in so.choice]
    table = np.array([counts["none"], counts["draft"]])
    table = table[:, table.sum(0) > 0]
    assert table.shape[1] >= 2 and sorted(table.sum(0))[-2] >= 30, f"a degenerate distribution: {counts}"
    _, p, _, _ = stats.chi2_contingency(table)
    assert p > 1e-3, f"speculative draws differ from plain ones: {counts} (p = {p:.2g})"


def test_tree_masks_equal_a_fresh_matcher_after_each_path(setup):
    """_fill_tree's depth-first walk (accept, fill, roll back) against a matcher that accepts
    each node's path from scratch, on random trees of allowed and ruled-out tokens."""
    target, draft = setup
    llm = make_llm(target, draft, "none")
    grammar = llm._grammars.compile(SO(regex=r"[0-9]{2,6}(-[a-z]{1,3})?"))
    vocab = llm.target.config.vocab_size
    tok = llm.tokenizer
    digits = [tok.convert_tokens_to_ids(c) for c in "0123456789-ab"]
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(2, 12))
        parents, tokens = random_tree(rng, digits, vocab, n)
        tree = specd.TokenTree.from_parents(np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32))
        matcher = xgr.GrammarMatcher(grammar)
        matcher.accept_token(digits[3])
        got = xgr.allocate_token_bitmask(n, vocab)
        _fill_tree(matcher, tree, got, 0)
        for node in range(n):
            fresh = xgr.GrammarMatcher(grammar)
            fresh.accept_token(digits[3])
            if not all(fresh.accept_token(t) for t in path_of(parents, tokens, node)):
                continue  # unreachable: its row is never read
            want = xgr.allocate_token_bitmask(1, vocab)
            if not fresh.is_terminated():
                fresh.fill_next_token_bitmask(want, 0)
            assert np.array_equal(got[node].numpy(), want[0].numpy()), (parents, tokens, node)
        assert matcher.accept_token(digits[4])  # the walk left the matcher where it started


def test_bad_constraints_fail_before_anything_runs(setup):
    target, draft = setup
    llm = make_llm(target, draft, "none")
    for bad in (SO(regex="([a-z"), SO(json='{"type": "object", "properties": 7}'), SO(grammar="root ::= (")):
        with pytest.raises(specd.InvalidArgumentError, match="could not be compiled"):
            llm.generate(["x"], specd.SamplingParams(structured_outputs=bad))
    assert not llm.engine.has_work
    with pytest.raises(specd.InvalidArgumentError, match="exactly one"):
        SO()
    with pytest.raises(specd.InvalidArgumentError, match="exactly one"):
        SO(regex="a", choice=["a"])
    with pytest.raises(specd.InvalidArgumentError, match="choice"):
        SO(choice=[])
    with pytest.raises(specd.InvalidArgumentError, match="structured_outputs"):
        specd.SamplingParams(structured_outputs={"json": {}})


def test_a_request_whose_constraint_cannot_go_on_fails_alone(setup):
    """min_tokens holds EOS back while the grammar allows nothing else: that request's rows
    have no finite logit and it fails; the other requests of the batch finish."""
    target, draft = setup
    llm = make_llm(target, draft, "draft")
    stuck = specd.SamplingParams(temperature=0.0, max_tokens=10, min_tokens=5, structured_outputs=SO(choice=["no"]))
    fine = specd.SamplingParams(temperature=0.0, max_tokens=10, structured_outputs=SO(choice=["yes", "no"]))
    outs = llm.generate(["a", "b", "c"], [fine, stuck, fine])
    assert outs[1].finish_reason == "error" and "request" in outs[1].error
    assert [o.finish_reason for o in (outs[0], outs[2])] == ["stop", "stop"]
    assert all(o.text in ("yes", "no") for o in (outs[0], outs[2]))


def test_a_refused_emitted_token_fails_its_request(setup):
    target, draft = setup
    llm = make_llm(target, draft, "none")
    req = llm._requests(["x"], specd.SamplingParams(structured_outputs=SO(regex="[0-9]+")))[0]
    req.output_ids.append(llm.tokenizer.convert_tokens_to_ids("a"))
    logits = np.zeros((1, llm.target.config.vocab_size), dtype=np.float32)
    import torch

    errors = {}
    GrammarMasks().apply(torch.from_numpy(logits), [(req, specd.TokenTree(0), 0)], errors)
    assert "refused output token" in errors[req.id]


def test_the_gpu_masking_equals_xgrammars_cpu_kernel():
    """apply_bitmask_torch (what a GPU runs) against xgrammar's CPU kernel (what the CPU
    runs), on random bitmasks over some rows of random logits, in float32 and bfloat16."""
    import torch

    rng = np.random.default_rng(3)
    for vocab, dtype in ((1000, torch.float32), (4099, torch.bfloat16)):
        logits = torch.from_numpy(rng.standard_normal((9, vocab)).astype(np.float32)).to(dtype)
        rows = np.array([0, 4, 5, 8])
        bitmask = xgr.allocate_token_bitmask(len(rows), vocab)
        bitmask.copy_(torch.from_numpy(rng.integers(-2**31, 2**31 - 1, bitmask.shape, dtype=np.int64).astype(np.int32)))
        want, got = logits.clone(), logits.clone()
        full = xgr.allocate_token_bitmask(logits.shape[0], vocab)  # xgrammar: a bitmask row per logits row
        full[torch.from_numpy(rows)] = bitmask
        xgr.apply_token_bitmask_inplace(want, full, indices=rows.tolist())
        apply_bitmask_torch(got, rows, bitmask)
        assert torch.equal(got, want)
        assert torch.isinf(got[rows]).any() and torch.equal(got[[1, 2, 3, 6, 7]], logits[[1, 2, 3, 6, 7]])
