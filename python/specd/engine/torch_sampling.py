"""The sampling rules of cpp/include/specd/sampling.h in torch, for the draft-tree builder's
distributions (draft_tree.py), and the rows' argmax the engine's greedy paths share. (The
draft loop samples with the sampling kernel: draft_sampling.py.) The softmax
is torch's (float64), within about 1e-7 (relative) of the C++ rule's weights, whose
exponential is a float polynomial made to give the same bits on the host and in the CUDA
kernels (detail/sampling_rules.h). Distributions from here are only ever the draft's, and
verification is lossless for any draft distribution it is given with its tokens."""

from __future__ import annotations

import numpy as np
import torch

from specd.engine.params import SamplingParams

# Philox "step" word of the draft model's sampling stream; verification uses step 0, so the
# draft's draws never coincide with the verifier's (a requirement of lossless verification).
DRAFT_STREAM = 1


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """The argmax of every row of ``logits`` ``[rows, vocab]`` -> int64 ``[rows]``, the lowest
    id among ties and a NaN's id where a row holds one (torch.argmax's rules), on the logits'
    device. On the CPU, float32 rows go through numpy's vectorised argmax: torch's CPU argmax
    took 8 ms for 16 rows of a 151,936-token vocabulary, numpy's 0.75 ms (one thread)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(logits.detach().numpy().argmax(-1).astype(np.int64, copy=False))
    return torch.argmax(logits, dim=-1)


def sampling_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """logits ``[vocab]`` -> probabilities ``[vocab]`` (float64) by the rules of sampling.h."""
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
