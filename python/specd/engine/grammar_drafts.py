"""Structured outputs on the proposing side: drafts the request's grammar rules out are
never verified, and the draft model proposes only tokens the grammar allows. Both are
optional for correctness (a ruled-out draft is rejected by its parent's masked target row,
engine/structured_outputs.py) and change no output; they save verify rows and raise
acceptance. ``Engine.constrain_drafts = False`` turns all of it off, ``Engine.forced_drafts
= False`` the forced tokens alone (benchmarks compare).

Rules
- Model-free trees (n-gram, suffix) get the grammar's forced continuation as their first
  branch (``forced_tokens``, ``with_forced``: xgrammar's jump-forward tokens, the longest
  continuation every output the grammar allows shares, e.g. ``", "age": `` between two
  fields of a JSON schema, up to the request's k tokens and its node budget; the proposer's
  nodes follow, those already on that branch merged into it). The target's masked rows
  leave such a token no alternative when the vocabulary spells the forced text one way
  only, so it is accepted as jump-forward decoding would emit it; where other spellings
  exist, verification decides as for any draft.
- Model-free trees (n-gram, suffix) are pruned before verification (``prune_tree``): a node
  stays when the grammar accepts its path after the request's output (the matcher walks the
  tree depth first: accept, go on down, roll back on the way up); a node it refuses goes,
  with everything below it. Below a node where the grammar has ended (only with ignore_eos
  does a request go on) nothing is constrained, on the target as here: that subtree stays.
- The draft model's rows are masked as the target's are (``DraftGrammar``): the row that
  proposes the token after path P (the drafts sampled so far in a chain, a node's
  ancestors in a tree) gets -inf on every token the grammar rules out after the output
  followed by P, and on every column past the grammar's (the target's) vocabulary. Greedy
  drafts are then the masked argmax; sampled drafts are drawn from the masked distribution,
  which is the distribution verification checks them against (q), so verification stays
  lossless; tree candidates are ranked on masked rows. Where the grammar has ended the row
  is not masked. A path the matcher refuses (only after a row the draft could not sample:
  token 0 of an all -inf row) leaves its row unmasked; verification rejects there anyway.
- A draft-model chain of a constrained request starts with the tokens the grammar forces
  (``DraftGrammar.forced``, at most k): the draft's first forward feeds them after its
  catch-up, in the slots drafts 1.. would take, so the draft writes the same K/V as when it
  drafts them one by one, and they are certain proposals (one-hot draft distributions: a
  forced token is accepted with the target's probability of it, which its mask makes 1
  where the vocabulary spells the text one way only). The draft model proposes the rest.
  Draft trees (draft_tree_width > 1) do not take forced tokens.
- A draft-model call with a constrained request runs its loop here, on the host (no draft
  graph runner): the matcher needs each forward's sampled tokens of constrained requests
  (one read per forward; the matcher is host code).
- Every matcher ends a call where it started (the request's output accepted): ``close``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from specd.engine.request import Request
from specd.engine.structured_outputs import GrammarMasks, mask_rows
from specd.verification import TokenTree


def constrained(request: Request) -> bool:
    return request.params.structured_outputs is not None


def prune_tree(matcher, tree: TokenTree) -> Optional[tuple[TokenTree, np.ndarray]]:
    """The part of ``tree`` whose paths ``matcher`` (at the request's output) accepts, as a new
    tree, and its nodes' indices in ``tree`` (parents first; int64); None when every node
    stays. The matcher ends where it started (module rules)."""
    parents, tokens = tree.parents, tree.tokens
    children: list[list[int]] = [[] for _ in range(len(parents))]
    for node in range(1, len(parents)):
        children[parents[node]].append(node)
    kept = [0]
    out = TokenTree(int(tokens[0]))
    # (node, its index in out, its children left, whether its token was accepted: rolled back on the way up)
    stack = [(0, 0, iter(children[0]), False)]
    while stack:
        node, at, left, accepted = stack[-1]
        child = next(left, None)
        if child is None:
            stack.pop()
            if accepted:
                matcher.rollback(1)
            continue
        token = int(tokens[child])
        free = matcher.is_terminated()  # the grammar has ended above: unconstrained below
        if not free and not matcher.accept_token(token):
            continue  # ruled out, with its subtree
        kept.append(child)
        stack.append((child, out.add_node(at, token), iter(children[child]), not free))
    if len(kept) == len(parents):
        return None
    return out, np.asarray(kept, dtype=np.int64)


class DraftGrammar:
    """Masks the draft model's rows of constrained requests during one draft call (module
    rules); ``close`` when the call ends."""

    def __init__(self, masks: GrammarMasks, forced: bool = True):
        self._masks = masks
        self._forced = forced  # False: ``forced`` gives nothing (Engine.forced_drafts)
        # request id -> (its matcher, the path tokens it has accepted past the output; None:
        # it refused the output, no row of the request is masked)
        self._state: dict[int, tuple[object, list[int]]] = {}

    def mask(self, logits: torch.Tensor, rows: Sequence[tuple[int, Request, Sequence[int]]]) -> None:
        """Masks ``logits[row]`` (``[rows, vocab]``, in place) for each (row, request, path): to
        the tokens the request's grammar allows after its output followed by ``path``."""
        masked, bitmask, vocab = [], None, 0
        for row, req, path in rows:
            matcher = self._seek(req, path)
            if matcher is None or matcher.is_terminated():
                continue
            if bitmask is None:
                vocab = req.grammar.tokenizer_info.vocab_size
                bitmask = self._masks.bitmask_rows(logits.shape[0], vocab)
            matcher.fill_next_token_bitmask(bitmask, row)  # now: the next row may move the matcher
            masked.append(row)
        if masked:
            mask_rows(logits, np.array(masked, dtype=np.int64), bitmask, vocab)

    def forced(self, req: Request, limit: int) -> list[int]:
        """forced_tokens after the request's output (none when its matcher refused it, or with
        forced tokens off)."""
        if not self._forced:
            return []
        matcher = self._seek(req, ())
        return forced_tokens(matcher, limit) if matcher is not None else []

    def _seek(self, req: Request, path: Sequence[int]):
        """The request's matcher having accepted its output and then ``path``; None when it
        refuses either (its row stays unmasked)."""
        state = self._state.get(req.id)
        if state is None:
            state = self._state[req.id] = (self._masks.matcher(req), [])
        matcher, accepted = state
        if matcher is None:
            return None
        same = 0
        for a, b in zip(accepted, path):
            if a != b:
                break
            same += 1
        if len(accepted) > same:
            matcher.rollback(len(accepted) - same)
            del accepted[same:]
        for token in path[same:]:
            if matcher.is_terminated() or not matcher.accept_token(int(token)):
                return None
            accepted.append(int(token))
        return matcher

    def close(self) -> None:
        """Rolls every matcher back to its request's output."""
        for matcher, accepted in self._state.values():
            if matcher is not None and accepted:
                matcher.rollback(len(accepted))
        self._state.clear()


def forced_tokens(matcher, limit: int) -> list[int]:
    """Up to ``limit`` tokens of the continuation the grammar forces from the matcher's state
    (xgrammar's jump-forward tokens: stop and special tokens excluded, a last token that a
    longer token could extend left out), as far as the matcher accepts them; the matcher ends
    where it started."""
    if limit <= 0 or matcher.is_terminated():
        return []
    tokens = matcher.find_jump_forward_tokens()[:limit]
    accepted = 0
    for token in tokens:
        if not matcher.accept_token(int(token)):
            break
        accepted += 1
    if accepted:
        matcher.rollback(accepted)
    return [int(t) for t in tokens[:accepted]]


def with_forced(tree: TokenTree, forced: Sequence[int], max_nodes: int) -> tuple[TokenTree, np.ndarray]:
    """A tree whose first branch from ``tree``'s root is the ``forced`` chain, then ``tree``'s
    drafts (parents first) while it has fewer than ``max_nodes`` drafts; a draft whose path the
    new tree already holds is that node. Returns it and, per node, its index in ``tree``
    (int64; -1 for the root's forced chain's nodes, which count as certain)."""
    out = TokenTree(int(tree.tokens[0]))
    source = [0]
    at = 0
    for token in forced[:max_nodes]:
        at = out.add_node(at, int(token))
        source.append(-1)
    where = {0: 0}  # node of tree -> node of out
    parents, tokens = tree.parents, tree.tokens
    for node in range(1, len(parents)):
        parent = where.get(int(parents[node]))
        if parent is None:
            continue  # its parent did not fit
        token = int(tokens[node])
        child = out.find_child(parent, token)
        if child < 0:
            if len(source) - 1 >= max_nodes:
                continue
            child = out.add_node(parent, token)
            source.append(node)
        where[node] = child
    return out, np.asarray(source, dtype=np.int64)
