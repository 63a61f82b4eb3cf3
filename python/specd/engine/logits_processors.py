"""Logits processors of SamplingParams (min_tokens, logit_bias, repetition / presence /
frequency penalties) applied to the target's logits rows of a verify step, in place, before
verification reads them: greedy and sampled verification then reproduce the processed
distribution exactly as they reproduce the raw one (lossless under speculation).

Rules (vLLM's semantics and order):
- A node's row gives the distribution of the token after it. Its context is the request's
  tokens (prompt, then output; the tree's root is the last of them) followed by the drafts
  on the tree path from the root's first child down to the node itself. So the row of a
  node at depth d decides output token ``len(output) + d`` (0-based), and counts the drafts
  above it as output tokens.
- min_tokens: while that index is below ``min_tokens``, the EOS tokens (unless
  ``ignore_eos``) and ``stop_token_ids`` get -inf.
- logit_bias: each listed token's bias is added.
- Then the penalties, on the result: a token in the prompt or the output (drafts above the
  node included) has its logit ``l`` replaced by ``l / r`` if ``l > 0`` else ``l * r``
  (repetition_penalty r); then ``frequency_penalty * count + presence_penalty * (count > 0)``
  is subtracted, where count is its occurrences in the output (drafts above the node
  included, the prompt not).
- Computed in float32, written back in the logits' dtype.

Host work per step: the sparse entries (row, token, count) of the processed requests, built
with numpy from each request's output (``np.unique`` per request and step) and its tree;
device work: one upload, one gather and three scatters for the whole step. Requests
without processors cost nothing.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from specd.engine.request import Request
from specd.uploads import upload_packed
from specd.verification import TokenTree


def _path_tokens(tree: TokenTree) -> list[np.ndarray]:
    """Per node, the tokens on its path below the root (itself included; the root: none)."""
    parents, tokens = np.asarray(tree.parents), np.asarray(tree.tokens)
    paths = [np.empty(0, dtype=np.int64)]
    for n in range(1, len(parents)):  # a parent's index is below its children's
        paths.append(np.append(paths[parents[n]], tokens[n]))
    return paths


def _stop_ids(req: Request, vocab: int) -> np.ndarray:
    """The tokens min_tokens holds back (ids past the vocabulary can never come: left out)."""
    ids = set(req.params.stop_token_ids)
    if not req.params.ignore_eos:
        ids |= set(req.eos_ids)
    return np.array(sorted(i for i in ids if i < vocab), dtype=np.int64)


class _Entries:
    """The step's sparse edits, collected per request then applied at once."""

    def __init__(self):
        self.mask: tuple[list, list] = ([], [])             # rows, tokens -> -inf
        self.bias: tuple[list, list, list] = ([], [], [])   # rows, tokens, biases
        # rows, tokens, output counts, in-prompt flags, repetition / presence / frequency
        self.penalty: tuple[list, ...] = ([], [], [], [], [], [], [])

    def add_request(self, req: Request, tree: TokenTree, start: int, vocab: int) -> None:
        p = req.params
        n = len(tree)
        rows = start + np.arange(n, dtype=np.int64)
        depths = np.asarray(tree.depths, dtype=np.int64)
        if p.min_tokens:
            blocked = rows[len(req.output_ids) + depths < p.min_tokens]
            stops = _stop_ids(req, vocab)
            if blocked.size and stops.size:
                self.mask[0].append(np.repeat(blocked, stops.size))
                self.mask[1].append(np.tile(stops, blocked.size))
        if p.logit_bias:
            tokens = np.fromiter(p.logit_bias.keys(), dtype=np.int64, count=len(p.logit_bias))
            biases = np.fromiter(p.logit_bias.values(), dtype=np.float64, count=len(p.logit_bias))
            self.bias[0].append(np.repeat(rows, tokens.size))
            self.bias[1].append(np.tile(tokens, n))
            self.bias[2].append(np.tile(biases, n))
        if p.repetition_penalty != 1 or p.presence_penalty or p.frequency_penalty:
            self._add_penalties(req, tree, rows, vocab)

    def _add_penalties(self, req: Request, tree: TokenTree, rows: np.ndarray, vocab: int) -> None:
        p = req.params
        out_tok, out_cnt = np.unique(np.asarray(req.output_ids, dtype=np.int64), return_counts=True)
        prompt_tok = (np.unique(np.asarray(req.prompt_ids, dtype=np.int64)) if p.repetition_penalty != 1
                      else np.empty(0, dtype=np.int64))
        paths = _path_tokens(tree)
        n = len(rows)
        lengths = np.array([len(x) for x in paths])
        # Every (row, token) of the row's context, then summed per pair.
        row_of = np.concatenate([np.repeat(rows, out_tok.size), np.repeat(rows, prompt_tok.size),
                                 np.repeat(rows, lengths)])
        token_of = np.concatenate([np.tile(out_tok, n), np.tile(prompt_tok, n), *paths])
        count_of = np.concatenate([np.tile(out_cnt, n), np.zeros(prompt_tok.size * n, dtype=np.int64),
                                   np.ones(int(lengths.sum()), dtype=np.int64)])
        flag_of = np.concatenate([np.zeros(out_tok.size * n, dtype=np.int64), np.ones(prompt_tok.size * n, dtype=np.int64),
                                  np.zeros(int(lengths.sum()), dtype=np.int64)])
        if row_of.size == 0:
            return
        keys, inverse = np.unique(row_of * vocab + token_of, return_inverse=True)
        counts = np.bincount(inverse, weights=count_of).astype(np.int64)
        in_prompt = (np.bincount(inverse, weights=flag_of) > 0).astype(np.int64)
        m = keys.size
        for column, value in zip(self.penalty, (keys // vocab, keys % vocab, counts, in_prompt,
                                                np.full(m, p.repetition_penalty), np.full(m, p.presence_penalty),
                                                np.full(m, p.frequency_penalty))):
            column.append(value)

    def apply(self, logits: torch.Tensor) -> None:
        device = logits.device
        ints = [np.concatenate(c) if c else np.empty(0, dtype=np.int64)
                for c in (*self.mask, *self.bias[:2], *self.penalty[:4])]
        floats = [np.concatenate(c) if c else np.empty(0) for c in (self.bias[2], *self.penalty[4:])]
        mask_r, mask_t, bias_r, bias_t, pen_r, pen_t, counts, in_prompt = upload_packed(device, ints)
        bias, rep, presence, frequency = upload_packed(device, floats, torch.float32)
        if mask_r.numel():
            logits.index_put_((mask_r, mask_t), torch.tensor(float("-inf"), dtype=logits.dtype, device=device))
        if bias_r.numel():
            logits.index_put_((bias_r, bias_t), bias.to(logits.dtype), accumulate=True)
        if pen_r.numel():
            v = logits[pen_r, pen_t].float()
            repeated = (in_prompt > 0) | (counts > 0)
            v = torch.where(repeated & (rep != 1), torch.where(v > 0, v / rep, v * rep), v)
            v = v - frequency * counts - presence * (counts > 0)
            logits.index_put_((pen_r, pen_t), v.to(logits.dtype))


def apply_logits_processors(logits: torch.Tensor, requests: Sequence[Request], trees: Sequence[TokenTree],
                            starts: Sequence[int]) -> bool:
    """Applies every processed request's logits processors to its rows of ``logits``
    ``[rows, vocab]`` (in place): request i's tree ``trees[i]`` has its node j at row
    ``starts[i] + j``. Returns whether anything was applied."""
    entries = _Entries()
    vocab = logits.shape[-1]
    touched = False
    for req, tree, start in zip(requests, trees, starts):
        if req.params.processed:
            entries.add_request(req, tree, start, vocab)
            touched = True
    if touched:
        entries.apply(logits)
    return touched
