"""Where a greedy output first differs from the reference, and how close the plain target was
to a tie there.

A load run compares every request's greedy output with a reference decoded once in another
batch. On a GPU in bf16 the two can differ for plain decoding itself: matrix products round
differently with the number of rows, and where the target's two best tokens are nearly tied
the argmax can flip. A speculation bug would instead give a token the target does not
prefer. So at the first differing position (the same prefix on both sides) the target's
logits decide which it is: ``explain`` runs the plain target alone over the prompt and the
reference's tokens before that position and reports by how much the reference's token led
the produced one, in logits and in units in the last place (ulps) of the model's dtype at
the leading logit's magnitude. Within ``NEAR_TIE_ULPS`` ulps the difference is attributed
to rounding (``near_tie``); beyond it, it is worth a look.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from specd.engine.model_runner import Segment, forward
from specd.kv_cache import KVCachePool, KVModel

NEAR_TIE_ULPS = 8.0


def first_difference(expected: Sequence[int], got: Sequence[int]) -> Optional[int]:
    """The first position where the two token lists differ (a length difference counts at the
    shorter one's end); None when they are equal."""
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return i
    return None if len(expected) == len(got) else min(len(expected), len(got))


def next_token_logits(model, ids: Sequence[int], block_size: int = 16) -> torch.Tensor:
    """The plain target's float32 logits ``[vocab]`` for the token after ``ids``: one causal
    forward of the whole sequence, alone, through a KV pool of its own."""
    pages = -(-len(ids) // block_size) + 1
    pool = KVCachePool([KVModel("target", model.config, model.dtype)], pages, block_size, device=model.device)
    pool.blocks.add_sequence(0)
    slots = pool.blocks.reserve(0, len(ids)).slots
    n = len(ids)
    seg = Segment(0, torch.tensor(list(ids), dtype=torch.int64), torch.arange(n, dtype=torch.int64), slots, n,
                  None, None, logits_from=n - 1)
    with torch.no_grad():
        return forward(model, pool, 0, [seg])[0].float().cpu()


def ulp(x: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s values at magnitude ``|x|``."""
    eps = torch.finfo(dtype).eps
    return eps * 2.0 ** math.floor(math.log2(abs(x))) if x != 0 else torch.finfo(dtype).tiny


def explain(model, prompt: Sequence[int], expected: Sequence[int], got: Sequence[int]) -> Optional[dict]:
    """The first difference between ``expected`` (reference) and ``got`` after ``prompt``, with
    the plain target's view of it; None when they are equal or one merely stops early."""
    pos = first_difference(expected, got)
    if pos is None or pos >= len(expected) or pos >= len(got):
        return None
    logits = next_token_logits(model, list(prompt) + list(expected[:pos]))
    want, have = int(expected[pos]), int(got[pos])
    lead = float(logits[want] - logits[have])
    spacing = ulp(float(logits.max()), model.dtype)
    return {"position": pos, "expected_token": want, "got_token": have,
            "expected_is_argmax": bool(int(logits.argmax()) == want),
            "got_rank": int((logits > logits[have]).sum()),
            "logit_lead": lead, "lead_ulps": lead / spacing, "dtype": str(model.dtype).replace("torch.", ""),
            "near_tie": abs(lead) <= NEAR_TIE_ULPS * spacing}
