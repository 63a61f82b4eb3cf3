"""Jump-forward decoding (Engine._jump_forward, SpeculationConfig.jump_forward_tokens): a
request with structured outputs that the policy gives no drafts (always without
speculation) verifies the tokens its grammar forces as a draft chain. Outputs equal those
without it (greedy: token for token; sampled: the same distribution, chi-square), in fewer
steps; the chains are exactly the grammar's forced tokens, within the limits; the policy
never hears of them; unconstrained requests are untouched."""

import numpy as np
import pytest

import specd
import xgrammar as xgr
from test_grammar_drafts import CONSTRAINTS, PROMPTS, SO, recording

GREEDY = {name: specd.SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=so)
          for name, so in CONSTRAINTS.items()}


def plain_llm(target, jump_forward_tokens, **kwargs):
    return specd.LLM(target, None, specd.SpeculationConfig(method="none", jump_forward_tokens=jump_forward_tokens),
                     **kwargs)


def forced_now(grammar, output, limit):
    """What a fresh matcher says the grammar forces after ``output`` (xgrammar's jump-forward
    tokens, as far as it accepts them), at most ``limit``."""
    m = xgr.GrammarMatcher(grammar)
    assert all(m.accept_token(t) for t in output)
    if m.is_terminated():
        return []
    want = []
    for t in m.find_jump_forward_tokens()[:limit]:
        if not m.accept_token(int(t)):
            break
        want.append(int(t))
    return want


@pytest.mark.parametrize("limit", [8, 3])
def test_without_speculation_forced_tokens_are_verified_as_drafts(tiny_llama_dir, monkeypatch, checked_steps, limit):
    """No speculation configured: with jump-forward each verified tree of a constrained request
    is empty or the grammar's forced tokens after its output (at most ``limit`` and room - 1);
    outputs equal those with it off, JSON takes fewer steps, the telemetry names the chains
    "forced"."""
    seen = recording(monkeypatch)
    steps, outputs = {}, {}
    for jf in (limit, 0):
        llm = plain_llm(tiny_llama_dir, jf)
        outputs[jf], steps[jf] = {}, {}
        for name, params in GREEDY.items():
            seen.clear()
            outs = llm.generate(PROMPTS, params)
            outputs[jf][name] = [o.token_ids for o in outs]
            steps[jf][name] = sum(o.metrics.verify_steps for o in outs)
            chains = 0
            for grammar, output, parents, tokens in seen:
                drafts = tokens[1:]
                if jf == 0:
                    assert not drafts
                    continue
                assert list(parents[1:]) == list(range(len(drafts)))  # a chain
                room = params.max_tokens - len(output)
                want = forced_now(grammar, output, min(jf, room - 1))
                assert drafts in ([], want), (output, drafts, want)
                chains += bool(drafts)
            if jf and name == "json":
                assert chains > 0
        if jf:
            metrics = llm.engine.metrics()
            assert metrics["methods"].get("forced", 0) > 0 and set(metrics["methods"]) == {"forced"}
            assert max(metrics["k_histogram"]) <= limit
    assert outputs[limit] == outputs[0]
    assert steps[limit]["json"] < steps[0]["json"], steps
    assert all(steps[limit][n] <= steps[0][n] for n in GREEDY), steps


def test_a_forced_output_takes_a_step_per_chain(tiny_llama_dir):
    """A one-string choice forces the whole output: with no speculation it is emitted in about
    len / jump_forward_tokens steps (other spellings of the text may cost a step more each)."""
    text = "maybe later, or never at all"
    params = specd.SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=SO(choice=[text]))
    runs = {}
    for jf in (8, 0):
        out = plain_llm(tiny_llama_dir, jf).generate(["Well?"], params)[0]
        assert out.text == text and out.finish_reason == "stop"
        runs[jf] = out.metrics.verify_steps, len(out.token_ids)
    (steps, length), (plain_steps, plain_length) = runs[8], runs[0]
    assert length == plain_length and plain_steps == length
    assert steps <= -(-length // 8) + 2, runs


def test_unconstrained_requests_in_the_batch_are_untouched(tiny_llama_dir):
    """In one batch with constrained requests, the unconstrained ones get no drafts and their
    outputs equal those of a batch without jump-forward."""
    free = specd.SamplingParams(temperature=0.0, max_tokens=24)
    params = [GREEDY["json"], free, GREEDY["regex"], free]
    prompts = PROMPTS
    results = {jf: plain_llm(tiny_llama_dir, jf).generate(prompts, params) for jf in (8, 0)}
    assert [o.token_ids for o in results[8]] == [o.token_ids for o in results[0]]
    for o, p in zip(results[8], params):
        if p is free:
            assert set(o.metrics.k_per_step) == {0} and o.metrics.draft_tokens == 0
    assert any(k > 0 for k in results[8][0].metrics.k_per_step)


@pytest.mark.parametrize("policy", ["goodput", "switch_off"])
def test_the_policy_never_hears_of_forced_chains(tiny_llama_dir, checked_steps, policy):
    """With a proposer and a policy that may choose k = 0, the steps where it did carry forced
    chains, which the policy is not told of (its observe sees only its proposer); outputs
    equal plain decoding's."""
    spec = specd.SpeculationConfig(method="ngram", num_speculative_tokens="auto" if policy == "goodput" else 4,
                                   policy=policy, switch_off_batch=1)
    llm = specd.LLM(tiny_llama_dir, None, spec)
    observed = []
    real = llm.engine.policy.observe

    def observe(request, method, depth, accepted):
        observed.append(method)
        return real(request, method, depth, accepted)
    llm.engine.policy.observe = observe
    plain = plain_llm(tiny_llama_dir, 0)
    for params in GREEDY.values():
        assert [o.token_ids for o in llm.generate(PROMPTS, params)] == \
               [o.token_ids for o in plain.generate(PROMPTS, params)]
    methods = llm.engine.metrics()["methods"]
    assert methods.get("forced", 0) > 0, methods
    assert "forced" not in observed and set(observed) <= {"ngram"}


def test_sampled_jump_forward_draws_the_constrained_distribution(tiny_llama_dir, monkeypatch):
    """Choices sharing long forced stretches, sampled at temperature 1.5 without speculation:
    600 draws with jump-forward against 600 without, a two-sample chi-square test over the
    token sequences (the tiny vocabulary spells the choices several ways, and which spelling
    comes is part of the distribution); forced chains were verified."""
    from scipy import stats

    so = SO(choice=["a return self.line", "a return None", "hunks", "a return self"])
    seen = recording(monkeypatch)
    counts, chains = {}, 0
    for jf in (8, 0):
        params = [specd.SamplingParams(temperature=1.5, max_tokens=24, seed=1000 * (jf > 0) + i, structured_outputs=so)
                  for i in range(600)]
        seen.clear()
        outs = plain_llm(tiny_llama_dir, jf).generate(["Pick:"] * 600, params)
        assert all(o.text in so.choice for o in outs)
        counts[jf] = [tuple(o.token_ids) for o in outs]
        if jf:
            chains = sum(len(tokens) > 1 for _, _, _, tokens in seen)
    assert chains > 100, f"forced chains were verified in {chains} steps only"
    kinds = sorted(set(counts[8]) | set(counts[0]))
    table = np.array([[c.count(kind) for kind in kinds] for c in (counts[0], counts[8])])
    common = table.sum(0) >= 10
    table = np.concatenate([table[:, common], table[:, ~common].sum(1, keepdims=True)], axis=1)
    table = table[:, table.sum(0) > 0]
    assert table.shape[1] >= 3, f"a degenerate distribution: {table}"
    _, p, _, _ = stats.chi2_contingency(table)
    assert p > 1e-3, f"draws with jump-forward differ from plain ones: {table} (p = {p:.2g})"


@pytest.mark.parametrize("bad", [-1, 65, 2.0, "8", None])
def test_jump_forward_tokens_is_checked(bad):
    with pytest.raises(specd.InvalidArgumentError, match="jump_forward_tokens"):
        specd.SpeculationConfig(jump_forward_tokens=bad)


def test_switched_off_with_the_constrained_drafts(tiny_llama_dir):
    """Engine.constrain_drafts (or forced_drafts) off turns jump-forward off too: no drafts."""
    for attr in ("constrain_drafts", "forced_drafts"):
        llm = plain_llm(tiny_llama_dir, 8)
        setattr(llm.engine, attr, False)
        outs = llm.generate(PROMPTS, GREEDY["json"])
        assert all(o.metrics.draft_tokens == 0 for o in outs), attr
