"""Structured outputs (SamplingParams.structured_outputs): a request's output follows a JSON
schema, a regex, a choice of strings or a grammar, through xgrammar (the grammar engine of
vLLM, SGLang and TensorRT-LLM), under speculation as without it.

Rules
- A request's constraint is compiled when the request is made (``GrammarCompiler``, one per
  LLM, its grammars cached by (kind, text)): a schema, regex or grammar xgrammar rejects
  raises InvalidArgumentError naming the problem, before anything runs. JSON (a schema, or
  any object) is compact: no whitespace between tokens of the JSON text (as vLLM's
  ``disable_any_whitespace``), which keeps a model from padding it with blanks. A choice is
  the alternation of its strings, taken literally.
- Each constrained request has a matcher (xgrammar's GrammarMatcher) that has accepted its
  output tokens; each step first feeds it the tokens emitted since the last one.
- In a verify step the row of tree node j gives the distribution of the token after the
  path from the root to j, so it is masked to the tokens the matcher allows after that
  path's drafts: the tree is walked depth first (accept a node's token, fill its row's mask,
  go on down, roll back on the way up). Every token the mask rules out gets -inf, so greedy
  and sampled verification reproduce the constrained distribution exactly as they reproduce
  a raw one, and a draft the grammar rules out is rejected by its parent's row. The rows
  below such a draft can never be read and stay as they are.
- Once the grammar has ended (the matcher accepted a stop token; only with ignore_eos does
  the request go on) its rows are not masked.
- A request whose matcher refuses an emitted token fails alone (finish_reason "error"); a
  row the constraint and the other processors leave without a finite logit fails its
  request the same way (batch_verify).
- Masks are filled on the host (int32 bitmasks, a bit per token) and applied to the step's
  constrained rows in one pass: on the CPU by xgrammar's kernel, in place; on a GPU
  uploaded once and unpacked and applied by torch ops (no Triton needed).
"""

from __future__ import annotations

import json
import re
from typing import Optional, Sequence

import numpy as np
import torch

from specd.engine.params import StructuredOutputsParams
from specd.errors import InvalidArgumentError
from specd.uploads import upload_packed


def _xgrammar():
    try:
        import xgrammar
    except ImportError as e:  # pragma: no cover - an install without the extra
        raise InvalidArgumentError("structured_outputs needs the xgrammar package: pip install "
                                   f"'specd[structured]' ({e})") from None
    return xgrammar


def structured_outputs_available() -> bool:
    """Whether xgrammar is installed (constrained requests can be made), without importing it."""
    import importlib.util

    return importlib.util.find_spec("xgrammar") is not None


class GrammarCompiler:
    """Compiles StructuredOutputsParams for one tokenizer and vocabulary (lazily: xgrammar is
    imported on the first constrained request)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Sequence[int]):
        self.tokenizer, self.vocab_size, self.stop_token_ids = tokenizer, vocab_size, sorted(stop_token_ids)
        self._compiler = None
        self._cache: dict[tuple[str, str], object] = {}

    def compile(self, params: StructuredOutputsParams):
        key = params.key
        grammar = self._cache.get(key)
        if grammar is None:
            grammar = self._cache[key] = self._compile(params)
        return grammar

    def _compile(self, params: StructuredOutputsParams):
        xgr = _xgrammar()
        if self.tokenizer is None:
            raise InvalidArgumentError("structured_outputs needs the model's tokenizer (this LLM has none)")
        if self._compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                      stop_token_ids=self.stop_token_ids or None)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        kind, text = params.key
        try:
            if kind == "json":
                return self._compiler.compile_json_schema(text, any_whitespace=False)
            if kind == "json_object":
                return self._compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "regex":
                return self._compiler.compile_regex(text)
            if kind == "choice":
                return self._compiler.compile_regex("|".join(_literal(c) for c in json.loads(text)))
            return self._compiler.compile_grammar(text)
        except Exception as e:  # xgrammar's parse errors (RuntimeError and its own classes)
            raise InvalidArgumentError(f"structured_outputs.{kind} could not be compiled: "
                                       f"{type(e).__name__}: {e}") from None


def _literal(text: str) -> str:
    """A regex matching ``text`` exactly (its operators escaped, nothing else)."""
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", text)


class GrammarMasks:
    """The engine's matchers: ``apply`` masks a step's constrained rows; ``release`` when a
    request ends."""

    def __init__(self):
        self._matchers: dict[int, object] = {}
        self._fed: dict[int, int] = {}  # request id -> output tokens its matcher has accepted
        self._bitmask = None  # int32 [rows, ceil(vocab / 32)] on the host, grown as needed, reused per step

    def release(self, request_id: int) -> None:
        self._matchers.pop(request_id, None)
        self._fed.pop(request_id, None)

    def apply(self, logits: torch.Tensor, constrained: list, errors: dict[int, str]) -> None:
        """Masks the rows of ``constrained``, a list of (request, tree, first row), in
        ``logits`` ``[rows, vocab]`` (in place). A request whose matcher refuses one of its
        emitted tokens gets a message in ``errors`` instead."""
        vocab = logits.shape[-1]
        jobs = []
        for req, tree, start in constrained:
            matcher = self.matcher(req)
            if matcher is None:
                errors[req.id] = (f"request {req.id}: structured_outputs: the grammar refused output token "
                                  f"{req.output_ids[self._fed[req.id]]} at position {self._fed[req.id]}")
                continue
            if not matcher.is_terminated():
                jobs.append((matcher, tree, start))
        if not jobs:
            return
        bitmask = self.bitmask_rows(logits.shape[0], vocab)  # a row per logits row, all allowed
        rows = []
        for matcher, tree, start in jobs:
            _fill_tree(matcher, tree, bitmask, start)
            rows.append(start + np.arange(len(tree), dtype=np.int64))
        mask_rows(logits, np.concatenate(rows), bitmask, vocab)

    def bitmask_rows(self, rows: int, vocab: int) -> torch.Tensor:
        """A bitmask int32 ``[rows, ceil(vocab / 32)]``, all bits set: the first ``rows`` rows of
        the reused host buffer (valid until the next call)."""
        xgr = _xgrammar()
        words = (vocab + 31) // 32
        if self._bitmask is None or self._bitmask.shape[0] < rows or self._bitmask.shape[1] != words:
            self._bitmask = xgr.allocate_token_bitmask(max(rows, 2 * (0 if self._bitmask is None
                                                                      else self._bitmask.shape[0])), vocab)
        bitmask = self._bitmask[:rows]
        bitmask.fill_(-1)
        return bitmask

    def matcher(self, req):
        """The request's matcher with its output tokens fed; None when it refused one."""
        matcher = self._matchers.get(req.id)
        if matcher is None:
            matcher = self._matchers[req.id] = _xgrammar().GrammarMatcher(req.grammar)
            self._fed[req.id] = 0
        fed = self._fed[req.id]
        for token in req.output_ids[fed:]:
            if matcher.is_terminated():
                break  # ended (ignore_eos goes on unconstrained)
            if not matcher.accept_token(token):
                return None
            fed += 1
        self._fed[req.id] = len(req.output_ids) if matcher.is_terminated() else fed
        return matcher


def mask_rows(logits: torch.Tensor, rows: np.ndarray, bitmask: torch.Tensor, vocab: int) -> None:
    """Sets ``logits[r, t]`` to -inf for each r in ``rows`` where bit t of ``bitmask[r]`` (int32,
    a row per logits row, on the host) is 0, for t below ``vocab`` (the grammar's vocabulary),
    and for every t at or past it (no token of the grammar's vocabulary: a draft model's wider
    rows): in place, one pass over the rows; on the CPU xgrammar's kernel, elsewhere torch ops."""
    width = logits.shape[-1]
    if logits.device.type == "cpu":
        _xgrammar().apply_token_bitmask_inplace(logits, bitmask, vocab_size=min(vocab, width), indices=rows.tolist())
    else:
        apply_bitmask_torch(logits, rows, bitmask[torch.from_numpy(rows)], min(vocab, width))
    if width > vocab:
        index = torch.from_numpy(rows).to(logits.device)
        logits[index, vocab:] = float("-inf")


def apply_bitmask_torch(logits: torch.Tensor, rows: np.ndarray, bitmask: torch.Tensor,
                        vocab: Optional[int] = None) -> None:
    """Sets ``logits[rows[i], t]`` to -inf where bit t of ``bitmask[i]`` (int32 ``[len(rows),
    ceil(vocab / 32)]``, on the host) is 0, for t below ``vocab`` (default: every column):
    one upload, then torch ops on the logits' device."""
    vocab = logits.shape[-1] if vocab is None else vocab
    r, bits = upload_packed(logits.device, [rows, bitmask.numpy()])
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((bits.to(torch.int32).unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab]
    sub = logits.index_select(0, r)
    sub[:, :vocab].masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, r, sub)


def _allowed(bitmask: torch.Tensor, row: int, token: int) -> bool:
    return bool((int(bitmask[row, token >> 5]) >> (token & 31)) & 1)


def _fill_tree(matcher, tree, bitmask: torch.Tensor, row0: int) -> None:
    """Fills rows row0 + j of ``bitmask`` with node j's mask (module rules); the matcher ends
    where it started."""
    parents, tokens = tree.parents, tree.tokens
    children: list[list[int]] = [[] for _ in range(len(parents))]
    for node in range(1, len(parents)):
        children[parents[node]].append(node)
    matcher.fill_next_token_bitmask(bitmask, row0)
    stack = [(0, iter(children[0]))]  # (node, its children left); the matcher has accepted the path to node
    while stack:
        node, left = stack[-1]
        child = next(left, None)
        if child is None:
            stack.pop()
            if node != 0:
                matcher.rollback(1)
            continue
        if matcher.is_terminated():
            continue  # the grammar ended at node: the rows below are not masked (module rules)
        token = int(tokens[child])
        if not _allowed(bitmask, row0 + node, token) or not matcher.accept_token(token):
            continue  # ruled out: its row and those below it are never read
        if not matcher.is_terminated():
            matcher.fill_next_token_bitmask(bitmask, row0 + child)
        stack.append((child, iter(children[child])))

