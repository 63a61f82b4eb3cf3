"""BASELINE for bench_kernels.py: how the draft graph sampled before it called the sampling
kernel (ops.sample_tokens_and_probs, python/specd/engine/draft_sampling.py), kept here to time
against it. Torch only: a float64 softmax and a stable sort of every row.

Sampling a batch of draft rows on the device with per-row parameters held in tensors, so one
captured CUDA graph serves any mix of requests (greedy and sampled, any temperature / top-k /
top-p / min-p, any seed). The rules are those of :func:`specd.engine.torch_sampling.
sampling_probs` (cpp/include/specd/sampling.h) applied to every row at once, with no
host-side branch on a parameter value; the draws are the draft stream's Philox draws of
Philox4x32-10 in torch (philox4x32_10 below, the C++ philox.h's draws) with a key per row.

Equality with the per-row functions: the same formulas in the same order, except that
renormalizing sums run over the whole row (zeros included) instead of over the kept tokens,
which can change the last bit of a probability. Greedy rows are exact (argmax of the logits).
A sampled token can therefore differ from the per-row path only when a draw lands within
~1e-15 of a CDF step; the distribution returned is always the one the token was drawn from,
so verification stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    product = b * a  # wraps in int64: the low 64 bits of the exact product
    return (product >> 32) & _MASK, product & _MASK


def philox4x32_10(c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor,
                  k0: int, k1: int) -> tuple[torch.Tensor, ...]:
    """Counters int64 (broadcastable) holding 32-bit words; key words as ints."""
    for r in range(10):
        if r > 0:
            k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs ``[B, vocab]``, u ``[B]`` in [0, 1) -> token ids ``[B]`` (the first id whose
    running sum exceeds u * total), without leaving the device."""
    cdf = torch.cumsum(probs, dim=-1)
    target = (u.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return idx.clamp_(max=probs.shape[-1] - 1)


@dataclass
class RowParams:
    """Sampling parameters and Philox key of each row (tensors ``[rows]`` on the logits' device)."""

    greedy: torch.Tensor       # bool: temperature == 0
    temperature: torch.Tensor  # float64 (any positive value on greedy rows)
    top_k: torch.Tensor        # int64, 0 = off
    top_p: torch.Tensor        # float64 in (0, 1]
    min_p: torch.Tensor        # float64 in [0, 1]
    seed_lo: torch.Tensor      # int64: low 32 bits of the request's seed
    seed_hi: torch.Tensor      # int64: high 32 bits
    request: torch.Tensor      # int64: the request word of the Philox counter


def row_sampling_probs(logits: torch.Tensor, p: RowParams) -> torch.Tensor:
    """logits ``[rows, vocab]`` -> float64 probabilities ``[rows, vocab]`` by the sampling rules,
    each row with its own parameters (greedy rows: one-hot at the argmax)."""
    rows, vocab = logits.shape
    x = logits.double()
    probs = torch.softmax(x / p.temperature[:, None], dim=-1)
    order = torch.sort(-probs, dim=-1, stable=True).indices  # (prob desc, id asc)
    ranked = torch.gather(probs, 1, order)
    rank = torch.arange(vocab, device=logits.device)[None, :]

    k_on = ((p.top_k > 0) & (p.top_k < vocab))[:, None]
    keep = rank < torch.where(k_on, p.top_k[:, None], vocab)
    ranked = torch.where(k_on, _renormalized(ranked, keep), ranked)

    p_on = (p.top_p < 1)[:, None]
    before = torch.cumsum(ranked, dim=-1) - ranked  # mass of the better-ranked tokens
    keep_p = keep & (before < p.top_p[:, None])
    keep_p[:, 0] = True
    ranked = torch.where(p_on, _renormalized(ranked, keep_p), ranked)
    keep = torch.where(p_on, keep_p, keep)

    m_on = (p.min_p > 0)[:, None]
    keep_m = keep & (ranked >= p.min_p[:, None] * ranked[:, :1])
    ranked = torch.where(m_on, _renormalized(ranked, keep_m), ranked)
    keep = torch.where(m_on, keep_m, keep)

    filtered = torch.zeros_like(probs).scatter(1, order, torch.where(keep, ranked, 0))
    probs = torch.where(k_on | p_on | m_on, filtered, probs)
    one_hot = torch.zeros_like(probs).scatter(1, torch.argmax(logits, dim=-1, keepdim=True), 1.0)
    return torch.where(p.greedy[:, None], one_hot, probs)


def _renormalized(ranked: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, ranked, 0)
    return kept / kept.sum(dim=-1, keepdim=True)


def row_uniforms(p: RowParams, stream: int, positions: torch.Tensor, draw: int = 0) -> torch.Tensor:
    """float64 ``[rows]`` uniforms: ``philox_uniform(seed_r, request_r, stream, positions[r],
    draw)`` of specd.engine.rng, with each row's own seed."""
    c0 = p.request & _MASK
    c1 = torch.full_like(c0, stream & _MASK)
    c2 = positions & _MASK
    c3 = torch.full_like(c0, draw & _MASK)
    a, b, _, _ = philox4x32_10(c0, c1, c2, c3, p.seed_lo & _MASK, p.seed_hi & _MASK)
    return ((a >> 5).double() * 67108864.0 + (b >> 6).double()) * (1.0 / 9007199254740992.0)


def sample_rows(logits: torch.Tensor, p: RowParams, stream: int,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: greedy rows take the argmax, the others draw from their distribution
    with the uniform of ``(stream, positions[r])``. Returns (tokens int64 ``[rows]``, float32
    distributions ``[rows, vocab]``). No host synchronisation."""
    probs = row_sampling_probs(logits, p)
    drawn = sample_inverse_cdf(probs, row_uniforms(p, stream, positions))
    tokens = torch.where(p.greedy, torch.argmax(logits, dim=-1), drawn)
    return tokens, probs.float()


def row_loop_sampling_probs(logits: torch.Tensor, p) -> torch.Tensor:
    """One row: logits ``[vocab]`` -> probabilities ``[vocab]`` (float64) by the rules of
    sampling.h, for a specd.SamplingParams ``p`` (a softmax and a stable sort of the row: the
    draft-tree loop's per-row path before it called the sampling kernel's op)."""
    logits = logits.double()
    if p.temperature == 0:
        out = torch.zeros_like(logits)
        out[torch.argmax(logits)] = 1
        return out
    probs = torch.softmax(logits / p.temperature, dim=-1)
    if p.top_k > 0 or p.top_p < 1 or p.min_p > 0:
        # Order by (prob desc, id asc): a stable sort of ids by -prob.
        order = torch.sort(-probs, stable=True).indices
        ranked = probs[order]
        keep = torch.ones_like(ranked, dtype=torch.bool)
        if 0 < p.top_k < ranked.numel():
            keep[p.top_k:] = False
            ranked = torch.where(keep, ranked, 0) / ranked[keep].sum()
        if p.top_p < 1:
            before = torch.cumsum(ranked, 0) - ranked  # mass of the better-ranked tokens
            keep &= before < p.top_p
            keep[0] = True
            ranked = torch.where(keep, ranked, 0)
            ranked = ranked / ranked.sum()
        if p.min_p > 0:
            keep &= ranked >= p.min_p * ranked[0]
            ranked = torch.where(keep, ranked, 0)
            ranked = ranked / ranked.sum()
        probs = torch.zeros_like(probs).scatter(0, order, torch.where(keep, ranked, 0))
    return probs
