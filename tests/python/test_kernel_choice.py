"""KernelChoice: its validation, the "auto" rule of the attention kernel, and that
KernelAttention passes the rule's answer for each forward's query tokens to the op (CPU: the
op is the float32 reference either way, so only the argument is observed)."""

import pytest
import torch

import specd
from specd import errors
from specd.models.attention import LayerKV
from specd.models.kernel_attention import DeviceAttentionMetadata, KernelAttention, kernel_attention_for
from specd.models.kernel_choice import GROUPED_ATTENTION_MIN_TOKENS, KernelChoice, grouped_for, kernels_of


def test_defaults_follow_the_h100_measurements():
    choice = KernelChoice()
    assert choice.grouped_attention == "auto" and choice.cluster_rows is True
    assert kernels_of(object()) == choice  # a model object without `kernels`: the defaults


@pytest.mark.parametrize("bad", ["yes", 1, None, "AUTO"])
def test_grouped_attention_takes_a_bool_or_auto(bad):
    with pytest.raises(errors.InvalidArgumentError, match="grouped_attention must be a bool or 'auto'"):
        KernelChoice(grouped_attention=bad)


def test_draw_takes_a_known_rule():
    assert KernelChoice().draw == "inverse_cdf" and KernelChoice(draw="gumbel").draw == "gumbel"
    for bad in ("Gumbel", "", None, True):
        with pytest.raises(errors.InvalidArgumentError, match="draw must be one of 'inverse_cdf', 'gumbel'"):
            KernelChoice(draw=bad)


def test_grouped_for_rule():
    n = GROUPED_ATTENTION_MIN_TOKENS
    assert [grouped_for("auto", t) for t in (1, n - 1, n, 4 * n)] == [False, False, True, True]
    assert all(grouped_for(True, t) for t in (1, n)) and not any(grouped_for(False, t) for t in (1, n))
    # Below n: verify-like forwards of >= 64 tokens and >= 5 per sequence (batch x query).
    assert [grouped_for("auto", b * q, b) for b, q in ((8, 9), (16, 5), (64, 5), (32, 9))] == [True] * 4
    assert not any(grouped_for("auto", b * q, b) for b, q in ((8, 5), (4, 9), (64, 1), (64, 3), (32, 2), (1, 9)))
    assert grouped_for("auto", 100, 0) is False  # sequences unknown: the token rule alone


def _one_sequence(tokens: int, heads=2, kv_heads=1, dim=8, block=16):
    pages = (tokens + block - 1) // block
    cache = LayerKV(torch.zeros(pages, block, kv_heads, dim), torch.zeros(pages, block, kv_heads, dim))
    meta = DeviceAttentionMetadata(
        positions=torch.arange(tokens), slot_mapping=torch.arange(tokens),
        block_tables=torch.arange(pages, dtype=torch.int32)[None], query_start=torch.tensor([0, tokens], dtype=torch.int32),
        kv_lens=torch.tensor([tokens], dtype=torch.int32))
    q = torch.randn(tokens, heads, dim)
    k, v = torch.randn(tokens, kv_heads, dim), torch.randn(tokens, kv_heads, dim)
    return q, k, v, cache, meta


@pytest.mark.parametrize("setting", ["auto", True, False])
def test_kernel_attention_passes_the_rule_per_forward(monkeypatch, setting):
    import specd.ops  # noqa: F401  (registers torch.ops.specd)

    seen = []
    real = torch.ops.specd.tree_attention

    def attention(*args):
        seen.append(args[8])  # (q, k, v, table, query_start, kv_lens, mask, scale, grouped, tree_lens)
        return real(*args)

    monkeypatch.setattr(torch.ops.specd, "tree_attention", attention, raising=False)
    backend = KernelAttention(grouped=setting)
    outs = []
    for tokens in (3, 70, GROUPED_ATTENTION_MIN_TOKENS):
        q, k, v, cache, meta = _one_sequence(tokens)
        outs.append(backend.forward(q, k, v, cache, meta, None))
        assert outs[-1].shape == q.shape and torch.isfinite(outs[-1]).all()
    # One sequence: 70 tokens is a prefill chunk of >= 5 per sequence and >= 64 tokens.
    assert seen == [grouped_for(setting, 3, 1), grouped_for(setting, 70, 1),
                    grouped_for(setting, GROUPED_ATTENTION_MIN_TOKENS, 1)]
    if setting == "auto":
        assert seen == [False, True, True]


def test_kernel_attention_for_a_model_takes_its_choice():
    class Model:
        kernels = KernelChoice(grouped_attention=False, cluster_rows=False)

    assert kernel_attention_for(Model()).grouped is False
    assert kernel_attention_for(object()).grouped == "auto"
    assert specd.KernelChoice is KernelChoice
