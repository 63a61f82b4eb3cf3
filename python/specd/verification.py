"""Sampling rules and lossless verification of draft tokens (CPU reference in C++).

Shapes: a tree has ``size = num_drafts + 1`` nodes (node 0 is the root, the request's last
token). ``target`` and ``draft`` rows are ``[size, vocab]``: row ``v`` is the distribution of
the token that follows node ``v``'s path. The rules are in ``cpp/include/specd/verify.h`` and
``sampling.h``; docs/api.md summarizes them.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

from specd import _core
from specd._arrays import float32_matrix, is_torch_tensor, like_input
from specd._core import DraftTreeBuilder, TokenTree
from specd.errors import InvalidArgumentError

__all__ = ["TokenTree", "DraftTreeBuilder", "VerifyOutput", "sampling_probs", "verify_greedy",
           "verify_greedy_tokens", "verify", "sample", "philox_uniform"]

philox_uniform = _core.philox_uniform


class VerifyOutput(NamedTuple):
    """Result of one verification.

    tokens: int32 ``[num_accepted + 1]`` accepted draft tokens, then the bonus token (or the
        recovered token that replaces the first rejected draft).
    path: int32 ``[num_accepted + 1]`` tree nodes of the accepted drafts, root (0) first.
    num_accepted: number of accepted draft tokens.
    """

    tokens: np.ndarray
    path: np.ndarray
    num_accepted: int


def _check_tree(tree: Any) -> TokenTree:
    if not isinstance(tree, TokenTree):
        raise InvalidArgumentError(f"tree must be a specd.TokenTree, got {type(tree).__name__}")
    return tree


def sampling_probs(logits: Any, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                   min_p: float = 0.0) -> Any:
    """Probabilities to sample from: softmax(logits / temperature) filtered by top-k, top-p and
    min-p (in that order), renormalized; one-hot argmax when ``temperature == 0``.

    ``logits``: ``[vocab]`` or ``[rows, vocab]`` (numpy or torch). Returns float32 of the same
    shape (2-D for 2-D input), a tensor for tensor input.
    """
    rows = float32_matrix(logits, "logits")
    out = _core.sampling_probs(rows, float(temperature), int(top_k), float(top_p), float(min_p))
    if np.ndim(logits) == 1 or (hasattr(logits, "dim") and logits.dim() == 1):
        out = out[0]
    return like_input(out, logits)


def verify_greedy(target: Any, tree: TokenTree) -> VerifyOutput:
    """Greedy verification: follow the children equal to the target's argmax (lowest id on
    ties); emit the argmax after the last accepted node. ``target``: ``[size, vocab]``
    probabilities or logits."""
    tokens, path, n = _core.verify_greedy(_check_tree(tree), float32_matrix(target, "target"))
    return VerifyOutput(tokens, path, n)


def verify_greedy_tokens(target_tokens: Any, tree: TokenTree) -> VerifyOutput:
    """Greedy verification from the target's argmax of each node (int ``[size]``, e.g.
    ``logits.argmax(-1)`` computed on the device): the same result as :func:`verify_greedy`
    on the full rows, without passing them to the host."""
    if is_torch_tensor(target_tokens):
        target_tokens = target_tokens.detach().to("cpu").numpy()
    tokens, path, n = _core.verify_greedy_tokens(_check_tree(tree),
                                                 np.ascontiguousarray(target_tokens, dtype=np.int32))
    return VerifyOutput(tokens, path, n)


def verify(target_probs: Any, tree: TokenTree, draft_probs: Optional[Any] = None, *, seed: int,
           request: int = 0, step: int = 0, position: int = 0,
           draft_sampling: str = "without_replacement") -> VerifyOutput:
    """Lossless stochastic verification (speculative / recursive rejection sampling).

    target_probs: ``[size, vocab]`` target distributions (after temperature/top-k/top-p/min-p,
        e.g. from :func:`sampling_probs`).
    draft_probs: ``[size, vocab]`` distributions the drafts were sampled from, or None for
        deterministic proposals (n-gram, suffix, top-k trees), verified as one-hot drafts.
    draft_sampling: how sibling drafts were drawn from ``draft_probs``:
        ``"without_replacement"`` (distinct siblings) or ``"independent"`` (i.i.d.).
    seed, request, step, position: the Philox key of this call's random draws; ``position`` is
        the absolute position of the first token decided. Same key, same result.
    """
    draft = None if draft_probs is None else float32_matrix(draft_probs, "draft_probs")
    tokens, path, n = _core.verify_stochastic(_check_tree(tree), float32_matrix(target_probs, "target_probs"),
                                              draft, draft_sampling, int(seed), int(request), int(step),
                                              int(position))
    return VerifyOutput(tokens, path, n)


def sample(probs: Any, *, seed: int, request: int = 0, step: int = 0, position: int = 0) -> int:
    """Plain sampling of one token from ``probs`` ``[vocab]`` with the verifier's draw for this
    key (equal to :func:`verify` on a tree with no drafts)."""
    row = float32_matrix(probs, "probs")
    if row.shape[0] != 1:
        raise InvalidArgumentError(f"probs must be one row [vocab], got shape {row.shape}")
    return int(_core.sample_token(row[0], int(seed), int(request), int(step), int(position)))
