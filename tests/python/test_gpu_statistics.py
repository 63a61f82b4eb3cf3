"""Statistical losslessness on the GPU path (the DESIGN non-negotiable, "proven by statistical
tests ... for chains and trees, and zero-probability tokens never appear"), through the torch
custom ops that run the CUDA kernels:

- ops.sample_tokens: many rows of the same logits, each with its own Philox key, follow the
  ``sampling_probs`` distribution of the row's parameters (temperature, top-k, top-p, min-p;
  float32 and bfloat16 logits), under both draw rules (inverse CDF, Gumbel-max); tokens of
  probability 0 never appear.
- ops.verify_stochastic: one verify step per trial, all trials in one batch, on a Markov
  "model" (the next-token row depends on the depth and the previous token). Chains (k=3) and
  trees (3 siblings, each with a child), with draft rows drawn without replacement or
  independently, and without draft rows (deterministic proposals): the first two emitted
  tokens (the second drawn from the target when only one was emitted) follow the target's
  joint distribution (chi-square, alpha = 0.001); tokens the target bans never appear.
- the engine on cuda with the draft graph (draft tokens sampled on the device in a CUDA
  graph): the first sampled token of 3,000 seeded requests follows the target's next-token
  distribution (the GPU twin of test_engine's CPU test).

Every ops test runs on the CPU implementation too (same keys, same tokens: it checks the test
itself); the cuda variants skip without a CUDA device or a specd build without CUDA kernels.
The C++ twin of the verification test is VerifyCudaLossless (tests/cpp/test_verify_cuda.cc).
"""

import numpy as np
import pytest
import torch
from scipy import stats

import specd.ops as ops
from specd import _core

V = 8            # vocabulary of the statistical cases
TRIALS = {"cuda": 200_000, "cpu": 30_000}  # the CPU run checks the test (its verify op is slow)
ALPHA = 1e-3


def device_or_skip(name: str) -> torch.device:
    if name == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device: the GPU variant of the statistical test needs one")
        if not ops.HAS_CUDA_KERNELS:
            pytest.skip("specd built without CUDA kernels")
    return torch.device(name)


DEVICES = ["cpu", "cuda"]


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of counts against probs (cells of expectation < 5 merged into one)."""
    counts, probs = counts.ravel().astype(np.float64), probs.ravel().astype(np.float64)
    expected = probs / probs.sum() * counts.sum()
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    want = np.append(expected[big], expected[~big].sum())
    if want[-1] == 0:
        observed, want = observed[:-1], want[:-1]
    return float(stats.chisquare(observed, want).pvalue)


def probs_of(logits: np.ndarray) -> np.ndarray:
    return _core.sampling_probs(logits.astype(np.float32), 1.0, 0, 1.0, 0.0)


# ---- sampling ----

SAMPLING = [(1.0, 0, 1.0, 0.0), (0.7, 3, 1.0, 0.0), (1.3, 0, 0.8, 0.0), (0.9, 5, 0.9, 0.05), (1.0, 0, 1.0, 0.1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("params", SAMPLING, ids=lambda p: "t{}_k{}_p{}_m{}".format(*p))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gumbel", [False, True], ids=["inverse_cdf", "gumbel"])
def test_sample_tokens_follow_sampling_probs(device, params, dtype, gumbel):
    dev = device_or_skip(device)
    rng = np.random.default_rng(21)
    row = (rng.standard_normal(V) * 1.5).astype(np.float32)
    row[2] = -np.inf  # banned by the model
    logits = torch.from_numpy(row).to(dtype)
    want = _core.sampling_probs(logits.float().numpy()[None], *params)[0]  # the rounded logits' rule
    n = TRIALS[device]
    t, k, p, m = params
    packed = ops.pack_sampling_params(torch.full((n,), t, dtype=torch.float64), torch.full((n,), k),
                                      torch.full((n,), p, dtype=torch.float64), torch.full((n,), m, dtype=torch.float64))
    keys = ops.pack_rng_keys(torch.tensor(5), torch.arange(n), torch.tensor(0), torch.tensor(17))
    tokens, status = ops.sample_tokens(logits.expand(n, V).to(dev), packed.to(dev), keys.to(dev), gumbel=gumbel)
    assert not status.any()
    counts = np.bincount(tokens.cpu().numpy(), minlength=V)
    assert counts[want == 0].sum() == 0, f"tokens of probability 0 drawn: {counts} vs {want}"
    assert chi_square_pvalue(counts[want > 0], want[want > 0]) > ALPHA, (counts, want)


# ---- stochastic verification ----


class MarkovModel:
    """Target and draft next-token rows P[depth][previous token], Q[depth][previous token]; the
    target bans the last token (probability 0), the draft does not."""

    def __init__(self, seed: int = 77, depths: int = 4):
        rng = np.random.default_rng(seed)
        logits = rng.standard_normal((depths, V, V)) * 1.5
        draft = logits + rng.standard_normal((depths, V, V))
        logits[..., V - 1] = -np.inf
        self.p = probs_of(logits.reshape(-1, V)).reshape(depths, V, V).astype(np.float64)
        self.q = probs_of(draft.reshape(-1, V)).reshape(depths, V, V).astype(np.float64)

    def joint_two(self) -> np.ndarray:
        """P(first two emitted tokens = a, b) after the root (token 0 at depth 0)."""
        return self.p[0, 0][:, None] * self.p[1]


def draw(rng, probs: np.ndarray) -> np.ndarray:
    """One draw per row of probs [n, V] (inverse CDF)."""
    c = np.cumsum(probs, axis=1)
    u = rng.random(len(probs))[:, None] * c[:, -1:]
    return np.minimum((u >= c).sum(axis=1), V - 1)


def draw_without_replacement(rng, probs: np.ndarray, count: int) -> np.ndarray:
    """count distinct tokens per row, sequentially from probs without replacement (Gumbel top-k)."""
    with np.errstate(divide="ignore"):
        keys = np.log(probs) + rng.gumbel(size=probs.shape)
    return np.argsort(-keys, axis=1)[:, :count]


def propose(model: MarkovModel, rng, depth: int, previous: np.ndarray, how: str) -> np.ndarray:
    """One child token per trial: drawn from the draft row, or (deterministic proposals) the
    target's most likely token, one trial in 3 a random token (independent of the verifier)."""
    if how != "deterministic":
        return draw(rng, model.q[depth, previous])
    best = model.p[depth, previous].argmax(axis=1)
    return np.where(rng.random(len(previous)) < 1 / 3, rng.integers(0, V, len(previous)), best)


def build_batch(model: MarkovModel, rng, trials: int, shape: str, how: str):
    """Trees of `trials` requests: 'chain' (root + 3 drafts) or 'tree' (root, 3 siblings, one
    child each). how: 'without_replacement' / 'independent' (drafted from Q, draft rows
    given) or 'deterministic' (no draft rows; tokens chosen independently of the verifier).
    Returns (offsets, parents, tokens, target rows, draft rows or None), numpy."""
    n = trials
    if shape == "chain":
        parents = np.array([-1, 0, 1, 2])
        depth = np.array([0, 1, 2, 3])
        tok = np.zeros((n, 4), dtype=np.int64)
        for j in range(1, 4):
            tok[:, j] = propose(model, rng, j - 1, tok[:, j - 1], how)
    else:
        parents = np.array([-1, 0, 0, 0, 1, 2, 3])
        depth = np.array([0, 1, 1, 1, 2, 2, 2])
        tok = np.zeros((n, 7), dtype=np.int64)
        root_q = np.broadcast_to(model.q[0, 0], (n, V))
        if how == "without_replacement":
            tok[:, 1:4] = draw_without_replacement(rng, root_q, 3)
        elif how == "independent":
            tok[:, 1:4] = np.stack([draw(rng, root_q) for _ in range(3)], axis=1)
        else:  # distinct tokens: the target's top 3, or (one trial in 3) 3 at random
            best = np.broadcast_to(np.argsort(-model.p[0, 0])[:3], (n, 3))
            tok[:, 1:4] = np.where(rng.random((n, 1)) < 1 / 3, np.argsort(rng.random((n, V)), axis=1)[:, :3], best)
        for c in range(4, 7):
            tok[:, c] = propose(model, rng, 1, tok[:, c - 3], how)
    width = len(parents)
    target = model.p[depth[None, :], tok].astype(np.float32)  # [n, width, V]
    draft = None if how == "deterministic" else model.q[depth[None, :], tok].astype(np.float32)
    offsets = np.arange(0, n * width + 1, width, dtype=np.int32)
    flat_parents = np.tile(parents, n).astype(np.int32)
    return (offsets, flat_parents, tok.reshape(-1).astype(np.int32), target.reshape(-1, V),
            None if draft is None else draft.reshape(-1, V))


@pytest.mark.parametrize("shape,how", [("chain", "without_replacement"), ("chain", "deterministic"),
                                       ("tree", "without_replacement"), ("tree", "independent"),
                                       ("tree", "deterministic")])
@pytest.mark.parametrize("device", DEVICES)
def test_verify_stochastic_emits_the_target_distribution(device, shape, how):
    dev = device_or_skip(device)
    model = MarkovModel()
    rng = np.random.default_rng({"chain": 1, "tree": 2}[shape] * 10 + len(how))
    trials = TRIALS[device]
    offsets, parents, tokens, target, draft = build_batch(model, rng, trials, shape, how)
    t = lambda a: torch.from_numpy(a).to(dev)  # noqa: E731
    keys = ops.pack_rng_keys(torch.tensor(99), torch.arange(trials), torch.tensor(0), torch.tensor(1)).to(dev)
    mode = "independent" if how == "independent" else "without_replacement"
    out_tokens, _, accepted, status = ops.verify_stochastic(t(offsets), t(parents), t(tokens), t(target),
                                                            None if draft is None else t(draft), keys, mode,
                                                            len(parents) // trials + 1)
    assert not status.any()
    out_tokens, accepted = out_tokens.cpu().numpy(), accepted.cpu().numpy()
    first = out_tokens[:, 0]
    assert (first >= 0).all()
    second = out_tokens[:, 1].copy()
    alone = accepted == 0  # only the recovered / bonus token: the next step samples the second
    second[alone] = draw(rng, model.p[1, first[alone]])
    assert accepted.mean() > 0.2, "drafts must get accepted for the test to mean anything"
    emitted = out_tokens[out_tokens >= 0]
    assert (emitted != V - 1).all(), "a token of target probability 0 was emitted"
    joint = model.joint_two()
    counts = np.zeros((V, V), dtype=np.int64)
    np.add.at(counts, (first, second), 1)
    assert counts[joint == 0].sum() == 0
    assert chi_square_pvalue(counts[joint > 0], joint[joint > 0]) > ALPHA
    assert chi_square_pvalue(np.bincount(first, minlength=V)[:V - 1], model.p[0, 0][:V - 1]) > ALPHA


# ---- the engine on cuda (draft loop sampled on the device, in a CUDA graph) ----


def test_gpu_engine_speculative_sampling_follows_the_target_distribution(tiny_llama_dir, tmp_path_factory):
    device_or_skip("cuda")
    import specd
    from test_engine import self_draft
    from tiny_models import load_hf_model

    draft = self_draft(tiny_llama_dir, tmp_path_factory.mktemp("gpu_stat_draft"))
    llm = specd.LLM(tiny_llama_dir, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=3),
                    device="cuda", draft_graph=True, max_num_seqs=256)
    prompt = llm.tokenizer("def fib(n):\n    return")["input_ids"]
    n = 3000
    outs = llm.generate([prompt] * n, [specd.SamplingParams(temperature=1.0, max_tokens=2, ignore_eos=True, seed=s)
                                       for s in range(n)])
    hf = load_hf_model(tiny_llama_dir)
    with torch.no_grad():
        p = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1].double(), -1).numpy()
    counts = np.bincount([o.token_ids[0] for o in outs], minlength=len(p))
    assert sum(o.metrics.accepted_tokens for o in outs) > n // 10  # drafts were accepted
    assert chi_square_pvalue(counts, p) > ALPHA
