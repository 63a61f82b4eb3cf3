"""How the draft model samples a token per row: ``specd.ops.sample_tokens_and_probs`` (the
kernels of cpp/include/specd/sampling_batch.h on CUDA, their C++ reference on the CPU), which
returns each row's token and the float32 distribution it was drawn from (what verification
checks the draft against), with no sort of the vocabulary and no host synchronisation.

Rows carry their own parameters (greedy rows: temperature 0, their argmax and a one-hot row)
and Philox key ``(seed, request, DRAFT_STREAM, position)``, where ``position`` is the position
of the token drawn; the draw is the rule's final draw at that key (sampling.h), or with the
draft model's ``KernelChoice(draw="gumbel")`` the Gumbel-max draw from the written row (the
same distribution). The eager draft loop (model_runner.run_draft) and the draft graph runner
pack the same words, so both draw the same tokens. A row the kernels reject (non-finite logits) gets token 0 and an all-zero
distribution: verification then fails that request alone with a message, and the token is a
valid input id for the draft forwards that follow in the same call.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from specd.engine.params import SamplingParams
from specd.engine.torch_sampling import DRAFT_STREAM
from specd.ops import host_call
from specd.uploads import to_device

_WORD = 0xFFFFFFFF


def signed64(x: int) -> int:
    """A 64-bit word (e.g. a uint64 seed) as the int64 with the same bits."""
    x &= 0xFFFFFFFFFFFFFFFF
    return x - (1 << 64) if x >= 1 << 63 else x


def param_words(p: SamplingParams) -> tuple[float, int, float, float]:
    """The ``specd::SamplingParams`` fields of one request (temperature 0 when greedy)."""
    return (0.0 if p.greedy else float(p.temperature), int(p.top_k), float(p.top_p), float(p.min_p))


def key_words(rng_seed: int, rng_request: int) -> tuple[int, int]:
    """Words 0 and 1 of a draft row's packed ``specd::RngKey`` (word 2 is the position)."""
    return signed64(rng_seed), (rng_request & _WORD) | (DRAFT_STREAM << 32)


def pack_params(params: Sequence[SamplingParams], device: torch.device,
                words: Callable[[SamplingParams], tuple] = param_words) -> torch.Tensor:
    """Packed params int64 ``[m, 4]`` of m rows (``specd.ops.pack_sampling_params``'s layout), on
    ``device``; ``words``: a row's (temperature, top_k, top_p, min_p) (default param_words)."""
    rows = [words(p) for p in params]
    floats = torch.tensor([[w[0], w[2], w[3]] for w in rows], dtype=torch.float64)
    top_k = torch.tensor([int(w[1]) for w in rows], dtype=torch.int64)
    return to_device(torch.stack([floats[:, 0].view(torch.int64), top_k, floats[:, 1].view(torch.int64),
                                  floats[:, 2].view(torch.int64)], dim=1), device)


def pack_draft_rows(params: Sequence[SamplingParams], seeds: Sequence[int], requests: Sequence[int],
                    positions: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed params int64 ``[m, 4]`` and keys int64 ``[m, 3]`` of m draft rows, on ``device``."""
    keys = torch.tensor([[*key_words(s, r), pos & _WORD] for s, r, pos in zip(seeds, requests, positions)],
                        dtype=torch.int64)
    return pack_params(params, device), to_device(keys, device)


def sample_draft_rows(logits: torch.Tensor, params: torch.Tensor, keys: torch.Tensor,
                      out: Optional[torch.Tensor] = None, cluster: bool = False,
                      gumbel: bool = False, totals: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits ``[m, vocab]``, packed params ``[m, 4]`` and keys ``[m, 3]`` -> (tokens int64
    ``[m]``, float32 distributions ``[m, vocab]``), on the logits' device. With ``out``
    (contiguous float32 ``[m, vocab]``, e.g. a draft graph buffer's row block) the
    distributions are written there and ``out`` is returned: no second copy of them; with
    ``totals`` (float64 ``[m]``, with ``out`` only) also each row's total (verification's
    draft_totals).
    ``cluster``: the sampling ops' thread-block cluster per row (KernelChoice.cluster_rows);
    ``gumbel``: tokens drawn from the rows by the Gumbel-max rule (KernelChoice.draw)."""
    if out is None:
        tokens, probs, status = host_call(torch.ops.specd.sample_tokens_and_probs)(logits, params, keys, cluster,
                                                                                   gumbel)
    else:
        tokens, status = host_call(torch.ops.specd.sample_tokens_and_probs_out)(logits, params, keys, out, cluster,
                                                                                gumbel, totals)
        probs = out
    return torch.where(status == 0, tokens, 0).to(torch.int64), probs
