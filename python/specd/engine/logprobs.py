"""Log-probabilities of generated tokens (``SamplingParams.logprobs``), read from the target's
logits rows of the step that emitted them.

Rules:
- The distribution is the target model's raw one: ``log_softmax`` of its logits row, before
  temperature, top-k, top-p or min-p (vLLM's default "raw" logprobs). A sampled token can
  therefore have a logprob its processed distribution would give differently; greedy
  tokens have rank 1.
- A step's emitted token j (accepted drafts first, then the bonus or recovered token) was
  decided by the row of the accepted path's node j: ``path[j]`` of the request's tree, row
  ``span start + path[j]`` of the step's logits ``[sum of tree sizes, vocab]``. Speculation
  changes which forward computed a row, not what it holds: the values equal plain decoding's
  up to floating-point reassociation (tests/python/test_logprobs.py).
- rank: 1 + the number of tokens with a strictly larger logit (ties share a rank).
- top: the ``logprobs`` most likely tokens of the row, most likely first (ties in id order:
  ``torch.topk``'s); the chosen token is reported too when it is not among them.

All requests of a step that asked for logprobs are gathered in one batch of device ops and
read with one copy, after verification (it decides the path): one more wait for the device in
steps that have such a request, none in the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from specd.errors import InvalidArgumentError
from specd.uploads import upload_packed


@dataclass
class Logprob:
    """One token's log-probability under the target's raw distribution at its position."""

    logprob: float
    rank: int                            # 1 = the row's most likely token (see the module rules)
    decoded_token: Optional[str] = None  # the token's own text (set in outputs when a tokenizer exists)


TokenLogprobs = dict[int, Logprob]  # token id -> its Logprob: the chosen token and the top ones


@dataclass
class RowRequest:
    """What one request needs from the step's logits: ``rows`` ``[m]`` (int64, into the logits)
    and the ``tokens`` ``[m]`` chosen from them; ``top`` alternatives per row."""

    rows: np.ndarray
    tokens: np.ndarray
    top: int


def gather_logprobs(logits: torch.Tensor, asks: list[RowRequest]) -> list[list[TokenLogprobs]]:
    """Per ask, per row, the chosen token's Logprob and the ``top`` most likely tokens'.

    ``logits``: ``[rows, vocab]`` (any float dtype, any device; computed in float32). One
    upload of the row and token indices, one read of the results."""
    if not asks:
        return []
    rows = np.concatenate([a.rows for a in asks]).astype(np.int64, copy=False)
    tokens = np.concatenate([a.tokens for a in asks]).astype(np.int64, copy=False)
    if rows.size == 0:
        return [[] for _ in asks]
    vocab = logits.shape[-1]
    if rows.min() < 0 or rows.max() >= logits.shape[0] or tokens.min() < 0 or tokens.max() >= vocab:
        raise InvalidArgumentError(f"logprob rows/tokens out of range: logits {tuple(logits.shape)}, rows "
                         f"[{rows.min()}, {rows.max()}], tokens [{tokens.min()}, {tokens.max()}]")
    top = max(a.top for a in asks)
    (index,) = upload_packed(logits.device, [np.stack([rows, tokens])])  # [2, m]
    picked = logits.index_select(0, index[0]).float()  # [m, vocab]
    lse = torch.logsumexp(picked, dim=-1, keepdim=True)  # [m, 1]
    chosen = picked.gather(1, index[1:].t())  # [m, 1]
    rank = (picked > chosen).sum(dim=-1, keepdim=True) + 1  # [m, 1]
    parts = [chosen - lse, rank.to(torch.float32)]
    if top:
        values, ids = torch.topk(picked, top, dim=-1)  # [m, top] each, sorted
        # Every token above slot j's value sits in a slot before j: its rank counts those.
        top_rank = (values.unsqueeze(1) > values.unsqueeze(2)).sum(dim=-1) + 1  # [m, top]
        parts += [values - lse, ids.to(torch.float32), top_rank.to(torch.float32)]  # < 2**24: exact
    host = torch.cat(parts, dim=1).cpu().numpy()  # [m, 2 + 3 * top]: the one read
    chosen_lp, ranks = host[:, 0], host[:, 1].astype(np.int64)
    top_lp = host[:, 2:2 + top]
    top_ids, top_ranks = host[:, 2 + top:2 + 2 * top].astype(np.int64), host[:, 2 + 2 * top:].astype(np.int64)
    out, start = [], 0
    for a in asks:
        per_row = []
        for i in range(start, start + len(a.rows)):
            entry = {int(top_ids[i, j]): Logprob(float(top_lp[i, j]), int(top_ranks[i, j])) for j in range(a.top)}
            entry[int(tokens[i])] = Logprob(float(chosen_lp[i]), int(ranks[i]))
            per_row.append(entry)
        out.append(per_row)
        start += len(a.rows)
    return out


def decode_tokens(entries: list[TokenLogprobs], tokenizer) -> list[TokenLogprobs]:
    """Sets ``decoded_token`` (each token's own text) where it is still None; returns ``entries``."""
    if tokenizer is not None:
        for entry in entries:
            for token, lp in entry.items():
                if lp.decoded_token is None:
                    lp.decoded_token = tokenizer.decode([token])
    return entries
