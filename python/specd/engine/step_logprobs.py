"""The logprobs work of an engine step (engine/logprobs.py has the rules): prompt logprobs
taken from prefill chunks' rows, and the emitted tokens' logprobs after verification."""

from __future__ import annotations

import numpy as np
import torch

from specd.engine.logprobs import RowRequest, TokenLogprobs, gather_logprobs
from specd.engine.scheduler import TARGET, WorkItem
from specd.uploads import upload_packed
from specd.verification import TokenTree, VerifyOutput


def take_prompt_rows(items: list[WorkItem], trees: dict[int, TokenTree], logits: torch.Tensor) -> torch.Tensor:
    """Records the prompt logprobs of the prefix chunks that returned their rows (requests that
    want them: ``Request.wants_prompt_rows``, model_runner.target_segment) and returns the
    trees' rows alone, in item order; ``logits`` itself when no chunk returned rows.

    The row of position q predicts token q + 1: a chunk of positions [c, c + n) gives the
    logprobs of prompt tokens c + 1 .. c + n (the last prompt token's comes from the end of
    prefill, before the first verify), each recorded once (a recomputed chunk after a
    preemption adds nothing)."""
    if not any(it.num_prefix and it.request.wants_prompt_rows for it in items):
        return logits
    keep, asks, owners, row = [], [], [], 0
    for it in items:
        req = it.request
        n = it.num_prefix if it.num_prefix and req.wants_prompt_rows else 0
        if n:
            c, have = req.computed[TARGET], len(req.prompt_logprobs)
            first, end = max(c, have - 1), min(c + n, len(req.prompt_ids) - 1)  # positions [first, end)
            if c <= have - 1 < end:
                asks.append(RowRequest(np.arange(row + first - c, row + end - c),
                                       np.asarray(req.tokens[first + 1:end + 1], dtype=np.int64),
                                       req.params.prompt_logprobs))
                owners.append(req)
            row += n
        if it.decide:
            size = len(trees[req.id])
            keep.append(np.arange(row, row + size))
            row += size
    for req, entries in zip(owners, gather_logprobs(logits, asks)):
        req.prompt_logprobs.extend(entries)
    (index,) = upload_packed(logits.device, [np.concatenate(keep) if keep else np.empty(0, dtype=np.int64)])
    return logits.index_select(0, index)


def row_starts(deciding: list[WorkItem], trees: dict[int, TokenTree]) -> dict[int, int]:
    """Request id -> the logits row of its tree's root: trees in item order, as the target's
    verify forward returns their rows and verification reads them."""
    starts, row = {}, 0
    for it in deciding:
        starts[it.request.id] = row
        row += len(trees[it.request.id])
    return starts


def step_logprobs(deciding: list[WorkItem], starts: dict[int, int], results: dict[int, VerifyOutput],
                   logits: torch.Tensor) -> dict[int, list[TokenLogprobs]]:
    """Request id -> the TokenLogprobs of every token its step emits (before any stop cut),
    for the verified requests that asked for logprobs: token j from the row of its accepted
    path's node j (``starts``: row_starts). One gather for them all; nothing when none asked."""
    asks, ids = [], []
    for it in deciding:
        req = it.request
        out = results.get(req.id)
        if req.params.logprobs is not None and out is not None:
            emitted = len(out.tokens)
            asks.append(RowRequest(starts[req.id] + np.asarray(out.path[:emitted], dtype=np.int64),
                                   np.asarray(out.tokens, dtype=np.int64), req.params.logprobs))
            ids.append(req.id)
    return dict(zip(ids, gather_logprobs(logits, asks))) if asks else {}
