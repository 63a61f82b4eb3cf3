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
- Last, structured outputs (engine/structured_outputs.py): each node's row is masked to the
  tokens the request's grammar allows after the node's path.

Where the work is (a step with processed requests; other steps pay nothing):
- min_tokens and logit_bias: sparse edits (row, token), one upload and two indexing ops.
- Penalties: each penalised request keeps, on the logits' device, its output tokens' counts
  and the mask of the tokens in its prompt or output (a row of ``PenaltyState``'s
  ``[capacity, vocab]`` tables), brought up to date each step with the tokens emitted since
  (the prompt once). The step's penalised rows are then processed densely: their requests'
  counts gathered ``[rows, vocab]``, the drafts above each row added (a sparse scatter), the
  rule applied to the rows in one pass. Host work per request and step: its new tokens and
  its tree's paths (O(nodes x depth)), not its history. On a GPU every column of those rows
  is processed (no host synchronisation); on the CPU only the columns a penalty can change
  (tokens seen by one of the step's penalised requests, or drafted), found first.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from specd.engine.request import Request
from specd.engine.structured_outputs import GrammarMasks
from specd.uploads import upload_packed
from specd.verification import TokenTree


def _path_counts(tree: TokenTree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every node, the drafts on its path below the root (itself included) as
    (node, token, count) triples, a token counted once per occurrence on the path."""
    parents, tokens = np.asarray(tree.parents), np.asarray(tree.tokens)
    nodes, toks, counts = [], [], []
    for n in range(1, len(parents)):
        seen: dict[int, int] = {}
        at = n
        while at > 0:
            t = int(tokens[at])
            seen[t] = seen.get(t, 0) + 1
            at = parents[at]
        nodes += [n] * len(seen)
        toks += seen.keys()
        counts += seen.values()
    return np.array(nodes, dtype=np.int64), np.array(toks, dtype=np.int64), np.array(counts, dtype=np.int64)


def _stop_ids(req: Request, vocab: int) -> np.ndarray:
    """The tokens min_tokens holds back (ids past the vocabulary can never come: left out)."""
    ids = set(req.params.stop_token_ids)
    if not req.params.ignore_eos:
        ids |= set(req.eos_ids)
    return np.array(sorted(i for i in ids if i < vocab), dtype=np.int64)


class PenaltyState:
    """Per penalised request, on one device: ``counts`` int32 ``[capacity, vocab]`` (its output
    tokens' occurrences) and ``seen`` bool ``[capacity, vocab]`` (in its prompt or output),
    one row (slot) per request, kept up to date with ``sync``; the tables double when full."""

    def __init__(self, vocab: int, device: torch.device):
        self.vocab, self.device = vocab, device
        self.counts = torch.zeros(0, vocab, dtype=torch.int32, device=device)
        self.seen = torch.zeros(0, vocab, dtype=torch.bool, device=device)
        self.slots: dict[int, int] = {}   # request id -> its row
        self._counted: dict[int, int] = {}  # request id -> output tokens already in its row
        self._free: list[int] = []

    def sync(self, requests: Sequence[Request]) -> list[int]:
        """Brings the requests' rows up to date (new requests get a cleared row and their
        prompt); returns their slots."""
        slots, rows, tokens, counted = [], [], [], []
        fresh = []
        for req in requests:
            slot = self.slots.get(req.id)
            if slot is None:
                slot = self._take()
                self.slots[req.id], self._counted[req.id] = slot, 0
                fresh.append(slot)
                rows.append(np.full(len(req.prompt_ids), slot, dtype=np.int64))
                tokens.append(np.asarray(req.prompt_ids, dtype=np.int64))
                counted.append(np.zeros(len(req.prompt_ids), dtype=np.int64))
            new = req.output_ids[self._counted[req.id]:]
            if new:
                rows.append(np.full(len(new), slot, dtype=np.int64))
                tokens.append(np.asarray(new, dtype=np.int64))
                counted.append(np.ones(len(new), dtype=np.int64))
                self._counted[req.id] = len(req.output_ids)
            slots.append(slot)
        if fresh:
            (index,) = upload_packed(self.device, [np.array(fresh)])
            self.counts.index_fill_(0, index, 0)
            self.seen.index_fill_(0, index, False)
        if rows:
            r, t, c = upload_packed(self.device, [np.concatenate(rows), np.concatenate(tokens), np.concatenate(counted)])
            self.counts.index_put_((r, t), c.to(torch.int32), accumulate=True)
            self.seen.index_put_((r, t), torch.ones((), dtype=torch.bool, device=self.device))
        return slots

    def release(self, request_id: int) -> None:
        slot = self.slots.pop(request_id, None)
        if slot is not None:
            del self._counted[request_id]
            self._free.append(slot)

    def _take(self) -> int:
        if not self._free:
            old = self.counts.shape[0]
            grow = max(old, 4)
            self.counts = torch.cat([self.counts, self.counts.new_zeros(grow, self.vocab)])
            self.seen = torch.cat([self.seen, self.seen.new_zeros(grow, self.vocab)])
            self._free = list(range(old + grow - 1, old - 1, -1))
        return self._free.pop()


class LogitsProcessors:
    """The engine's logits processors: ``apply`` per step, ``release`` when a request ends.
    ``all_columns``: penalties process every column of their rows (True), or only those they
    can change (False); None: all on a GPU, the changeable ones on the CPU (module rules)."""

    def __init__(self, all_columns: Optional[bool] = None):
        self._penalties: Optional[PenaltyState] = None
        self._grammars = GrammarMasks()
        self.all_columns = all_columns

    @property
    def grammars(self) -> GrammarMasks:
        """The requests' grammar matchers (structured outputs)."""
        return self._grammars

    def release(self, request_id: int) -> None:
        if self._penalties is not None:
            self._penalties.release(request_id)
        self._grammars.release(request_id)

    def apply(self, logits: torch.Tensor, requests: Sequence[Request], trees: Sequence[TokenTree],
              starts: Sequence[int], errors: Optional[dict[int, str]] = None) -> bool:
        """Applies every processed request's processors to its rows of ``logits``
        ``[rows, vocab]`` (in place): request i's tree ``trees[i]`` has its node j at row
        ``starts[i] + j``. Returns whether anything was applied. A request whose processors
        cannot go on (its grammar refused an emitted token) gets a message in ``errors``."""
        vocab = logits.shape[-1]
        mask_r, mask_t, bias_r, bias_t, bias_v = [], [], [], [], []
        penalised, constrained = [], []
        touched = False
        for req, tree, start in zip(requests, trees, starts):
            p = req.params
            if not p.processed:
                continue
            touched = True
            n = len(tree)
            rows = start + np.arange(n, dtype=np.int64)
            if p.min_tokens:
                blocked = rows[len(req.output_ids) + np.asarray(tree.depths, dtype=np.int64) < p.min_tokens]
                stops = _stop_ids(req, vocab)
                if blocked.size and stops.size:
                    mask_r.append(np.repeat(blocked, stops.size))
                    mask_t.append(np.tile(stops, blocked.size))
            if p.logit_bias:
                tokens = np.fromiter(p.logit_bias.keys(), dtype=np.int64, count=len(p.logit_bias))
                bias_r.append(np.repeat(rows, tokens.size))
                bias_t.append(np.tile(tokens, n))
                bias_v.append(np.tile(np.fromiter(p.logit_bias.values(), dtype=np.float64, count=tokens.size), n))
            if p.penalized:
                penalised.append((req, tree, start))
            if p.structured_outputs is not None:
                constrained.append((req, tree, start))
        if mask_r:
            r, t = upload_packed(logits.device, [np.concatenate(mask_r), np.concatenate(mask_t)])
            logits.index_put_((r, t), torch.full((), float("-inf"), dtype=logits.dtype, device=logits.device))
        if bias_r:
            r, t = upload_packed(logits.device, [np.concatenate(bias_r), np.concatenate(bias_t)])
            (v,) = upload_packed(logits.device, [np.concatenate(bias_v)], torch.float32)
            logits.index_put_((r, t), v.to(logits.dtype), accumulate=True)
        if penalised:
            self._apply_penalties(logits, penalised)
        if constrained:
            self._grammars.apply(logits, constrained, errors if errors is not None else {})
        return touched

    def _apply_penalties(self, logits: torch.Tensor, penalised: list[tuple[Request, TokenTree, int]]) -> None:
        if self._penalties is None or self._penalties.device != logits.device:
            self._penalties = PenaltyState(logits.shape[-1], logits.device)
        state = self._penalties
        slots = state.sync([req for req, _, _ in penalised])
        rows, row_slots, factors, path = [], [], [], ([], [], [])
        at = 0  # index of the request's first row among the penalised rows
        for (req, tree, start), slot in zip(penalised, slots):
            n = len(tree)
            rows.append(start + np.arange(n, dtype=np.int64))
            row_slots.append(np.full(n, slot, dtype=np.int64))
            p = req.params
            factors.append(np.repeat([[p.repetition_penalty, p.presence_penalty, p.frequency_penalty]], n, axis=0))
            nodes, toks, counts = _path_counts(tree)
            for column, value in zip(path, (at + nodes, toks, counts)):
                column.append(value)
            at += n
        device = logits.device
        r, s, pr, pt, pc = upload_packed(device, [np.concatenate(rows), np.concatenate(row_slots),
                                                  *(np.concatenate(c) for c in path)])
        (f,) = upload_packed(device, [np.concatenate(factors)], torch.float32)  # [rows, 3]
        cols = None  # the columns processed: all (a GPU: no host sync), or on the CPU only
        if not (device.type != "cpu" if self.all_columns is None else self.all_columns):
            # only those a penalty can change: seen by a request, or drafted above a row
            cols = torch.unique(torch.cat([state.seen.index_select(0, s.unique()).any(0).nonzero().squeeze(1), pt]))
            pt = torch.searchsorted(cols, pt)
        counts = _columns(state.counts, s, cols)  # [rows, vocab or cols]
        seen = _columns(state.seen, s, cols)
        if pr.numel():  # the drafts above each row
            counts.index_put_((pr, pt), pc.to(torch.int32), accumulate=True)
            seen.index_put_((pr, pt), torch.ones((), dtype=torch.bool, device=device))
        rep, presence, frequency = f[:, 0:1], f[:, 1:2], f[:, 2:3]
        x = _columns(logits, r, cols).float()
        x = torch.where(seen & (rep != 1), torch.where(x > 0, x / rep, x * rep), x)
        x = x - frequency * counts - presence * (counts > 0)
        if cols is None:
            logits.index_copy_(0, r, x.to(logits.dtype))
        else:
            logits.index_put_((r.unsqueeze(1), cols.unsqueeze(0)), x.to(logits.dtype))


def _columns(table: torch.Tensor, rows: torch.Tensor, cols: Optional[torch.Tensor]) -> torch.Tensor:
    """``table[rows][:, cols]`` (all columns when None), as a new tensor, the columns taken
    first (a few of a wide table)."""
    return table.index_select(0, rows) if cols is None else table.index_select(1, cols).index_select(0, rows)

