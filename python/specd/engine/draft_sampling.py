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

import struct
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


# One packed specd::SamplingParams row (temperature, top_k in the low half of word 1, top_p,
# min_p: specd.ops.pack_sampling_params' layout) and one RngKey (seed, request | step << 32,
# position: pack_rng_keys'), little-endian int64 words.
_PARAM_ROW = struct.Struct("<dqdd")
_KEY_ROW = struct.Struct("<qqq")


def pack_words(param_rows: Sequence[tuple], key_rows: Sequence[tuple], device: torch.device,
               repeats: Optional[Sequence[int]] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed params int64 ``[m, 4]`` and keys int64 ``[n, 3]`` on ``device``, in one
    host-to-device copy: ``param_rows`` are (temperature, top_k, top_p, min_p), row i repeated
    ``repeats[i]`` times (default once); ``key_rows`` are (seed, request | step << 32, position)
    as int64 words. One struct call per row instead of a dozen small torch ops."""
    counts = [1] * len(param_rows) if repeats is None else list(repeats)
    m = sum(counts)
    buf = bytearray(_PARAM_ROW.size * m + _KEY_ROW.size * len(key_rows))
    at = 0
    for (temperature, top_k, top_p, min_p), count in zip(param_rows, counts):
        row = _PARAM_ROW.pack(float(temperature), int(top_k) & _WORD, float(top_p), float(min_p))
        buf[at:at + len(row) * count] = row * count
        at += len(row) * count
    for key in key_rows:
        _KEY_ROW.pack_into(buf, at, *key)
        at += _KEY_ROW.size
    host = torch.frombuffer(buf, dtype=torch.int64) if buf else torch.empty(0, dtype=torch.int64)
    words = to_device(host, device)
    return words[:4 * m].view(m, 4), words[4 * m:].view(len(key_rows), 3)


def pack_params(params: Sequence[SamplingParams], device: torch.device,
                words: Callable[[SamplingParams], tuple] = param_words) -> torch.Tensor:
    """Packed params int64 ``[m, 4]`` of m rows (``specd.ops.pack_sampling_params``'s layout), on
    ``device``; ``words``: a row's (temperature, top_k, top_p, min_p) (default param_words)."""
    return pack_words([words(p) for p in params], (), device)[0]


def pack_draft_rows(params: Sequence[SamplingParams], seeds: Sequence[int], requests: Sequence[int],
                    positions: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed params int64 ``[m, 4]`` and keys int64 ``[m, 3]`` of m draft rows, on ``device``
    (one copy)."""
    return pack_words([param_words(p) for p in params],
                      [(*key_words(s, r), pos & _WORD) for s, r, pos in zip(seeds, requests, positions)], device)


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
