"""One request's state in the engine: its tokens, KV progress, stop handling and metrics."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Optional

from specd.engine.logprobs import TokenLogprobs, decode_tokens
from specd.engine.outputs import RequestMetrics, RequestOutput
from specd.engine.params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Detokenizer:
    """Incremental detokenization: new text per appended token, never splitting a multi-byte
    character (a trailing U+FFFD waits for the next token)."""

    def __init__(self, tokenizer, prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-6:])  # a little context so the first token decodes right
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        # A fast tokenizer's decode is its Rust backend's decode, then an optional clean-up of
        # spaces. Without the clean-up, the backend is called directly: the same text at a
        # third of the cost per token (7.3 -> 2.7 us for Qwen2.5's tokenizer), which the
        # engine pays twice per generated token on the host, between GPU steps.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:
            self.decode = lambda ids: backend.decode(ids, skip_special_tokens=True)
        else:
            self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token: int) -> str:
        """The text ``token`` completes ("" while a character is incomplete)."""
        self.ids.append(token)
        return self._advance() or ""

    def push_many(self, tokens: list[int]) -> str:
        """What pushing ``tokens`` one by one gives, concatenated, with one pair of decodes
        instead of a pair per token. When their text ends in an incomplete character they are
        pushed one by one (which gives the text up to the last complete character)."""
        before = len(self.ids)
        self.ids.extend(tokens)
        text = self._advance()
        if text is not None:
            return text
        del self.ids[before:]
        return "".join(self.push(t) for t in tokens)

    def _advance(self) -> Optional[str]:
        """The text of the ids past the read offset, moving the offsets past them; None (offsets
        kept) while that text ends in an incomplete character."""
        prefix = self.decode(self.ids[self.prefix_offset:self.read_offset])
        full = self.decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix):]
        return None


@dataclass
class Request:
    id: int
    prompt: Optional[str]
    prompt_ids: list[int]
    params: SamplingParams
    rng_seed: int        # Philox key
    rng_request: int     # Philox counter word: 0 when the user gave a seed (same seed, same output)
    max_len: int         # prompt + output never exceeds this (the context limit)
    eos_ids: frozenset
    detokenizer: Optional[Detokenizer] = None
    output_ids: list[int] = field(default_factory=list)
    accepted_flags: list[bool] = field(default_factory=list)  # per output token: an accepted draft?
    status: Status = Status.WAITING
    finish_reason: Optional[str] = None
    error: Optional[str] = None  # why it failed (finish_reason "error")
    computed: list[int] = field(default_factory=lambda: [0, 0])  # KV committed: target, draft
    in_blocks: bool = False  # holds a sequence in the block manager
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    started: Optional[float] = None
    finished_at: Optional[float] = None
    stream_sent: tuple[int, int] = (0, 0)  # (text chars, tokens) already streamed
    online: bool = False  # added by LLM.add_request: its steps and end go to Engine.touched
    grammar: object = None  # with SamplingParams.structured_outputs: its compiled grammar (xgrammar)
    # Per output token, with SamplingParams.logprobs (else None): engine/logprobs.py.
    logprobs: Optional[list[TokenLogprobs]] = None
    cumulative_logprob: Optional[float] = None
    # Per prompt token, with SamplingParams.prompt_logprobs: None for the first, then filled
    # in order as prefill chunks compute their rows (complete once it has a prompt's length).
    prompt_logprobs: Optional[list[Optional[TokenLogprobs]]] = None
    # Text (see ``text``): the first ``_decoded`` output tokens' text, and the first
    # ``_pieced`` tokens' pieces (``_pieced`` <= ``_decoded``).
    _text: str = field(default="", repr=False)
    _pieces: list[str] = field(default_factory=list, repr=False)
    _decoded: int = field(default=0, repr=False)
    _pieced: int = field(default=0, repr=False)
    _tokens: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self):
        self._tokens = self.prompt_ids + self.output_ids
        if self.params.logprobs is not None and self.logprobs is None:
            self.logprobs, self.cumulative_logprob = [], 0.0
        if self.params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None]

    @property
    def wants_prompt_rows(self) -> bool:
        """Whether some prompt token still lacks its logprobs (prefill must return its rows)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_ids)

    @property
    def tokens(self) -> list[int]:
        """Prompt then output ids (the request's own list: read it, do not change it)."""
        return self._tokens

    # Text is made when it is read, not per step: one pair of decodes for all the tokens
    # since the last read (Detokenizer.push_many) instead of a pair per token, between GPU
    # steps. Per-token pieces (streams) are made token by token, as are both when the
    # request has stop strings (emit needs the text at every token then).

    @property
    def text(self) -> str:
        """The output's text (up to a stop string, which is cut)."""
        pending = self.output_ids[self._decoded:]
        if pending and self.detokenizer is not None:
            self._text += self.detokenizer.push_many(pending)
        self._decoded = len(self.output_ids)
        return self._text

    @property
    def pieces(self) -> list[str]:
        """Per output token, the text it added ("" for a token that completed no character);
        their concatenation is ``text``."""
        if self._pieced < len(self.output_ids):
            if self.detokenizer is None:
                self._pieces.extend([""] * (len(self.output_ids) - self._pieced))
            elif self._pieced < self._decoded:  # the text ran ahead (a text-only read): redo it piece by piece
                self.detokenizer = Detokenizer(self.detokenizer.tokenizer, self.prompt_ids)
                self._pieces = [self.detokenizer.push(t) for t in self.output_ids]
                self._text = "".join(self._pieces)
            else:
                new = [self.detokenizer.push(t) for t in self.output_ids[self._pieced:]]
                self._pieces.extend(new)
                self._text += "".join(new)
            self._pieced = self._decoded = len(self.output_ids)
        return self._pieces

    @property
    def length(self) -> int:
        return len(self._tokens)

    @property
    def finished(self) -> bool:
        return self.status == Status.FINISHED

    def room(self) -> int:
        """How many more tokens it may emit (max_tokens and the context limit)."""
        return min(self.params.max_tokens - len(self.output_ids), self.max_len - self.length)

    def emit(self, tokens: list[int], num_accepted: int, logprobs: Optional[list[TokenLogprobs]] = None) -> int:
        """Appends this step's tokens (accepted drafts, then the bonus/recovered token), stopping
        at EOS, a stop token or string, max_tokens or the context limit. Returns how many of
        them were kept. ``logprobs``: per token, its TokenLogprobs (kept with the token; the
        request must have asked for them)."""
        kept = 0
        strings = self.detokenizer is not None and bool(self.params.stop)
        stop_ids = self.params.stop_token_ids
        eos = () if self.params.ignore_eos else self.eos_ids
        room = self.room()
        for i, token in enumerate(tokens):
            self.output_ids.append(token)
            self._tokens.append(token)
            self.accepted_flags.append(i < num_accepted)
            if logprobs is not None:
                self.logprobs.append(logprobs[i])
                self.cumulative_logprob += logprobs[i][token].logprob
            kept += 1
            room -= 1
            if token in eos or token in stop_ids:
                self.finish("stop")
            elif strings and self._cut_at_stop_string():
                self.finish("stop")
            elif room <= 0:
                self.finish("length")
            if self.finished:
                break
        self.metrics.generated_tokens = len(self.output_ids)
        return kept

    def _cut_at_stop_string(self) -> bool:
        """After the last output token: cuts the text (and pieces) at the first stop string
        in it, if any. Pieces are made token by token here (``pieces``)."""
        pieces = self.pieces
        for stop in self.params.stop:
            at = self._text.find(stop)
            if at >= 0:
                excess = len(self._text) - at
                self._text = self._text[:at]
                for i in range(len(pieces) - 1, -1, -1):  # keep "".join(pieces) == text
                    if excess <= 0:
                        break
                    cut = min(excess, len(pieces[i]))
                    pieces[i] = pieces[i][:len(pieces[i]) - cut]
                    excess -= cut
                return True
        return False

    def fail(self, message: str) -> None:
        """Ends the request with finish_reason "error" (its output so far is kept)."""
        self.error = message
        self.finish("error")

    def finish(self, reason: str) -> None:
        """Ends the request: "stop", "length", "error" (fail) or "abort" (Engine.abort)."""
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.finished_at = time.perf_counter()
        if self.started is not None:
            self.metrics.seconds = self.finished_at - self.started

    def logprobs_from(self, start: int) -> Optional[list[TokenLogprobs]]:
        """The output tokens' logprobs from ``start`` on, their tokens' text decoded (None when
        the request did not ask for logprobs)."""
        if self.logprobs is None:
            return None
        return decode_tokens(self.logprobs[start:], self.detokenizer.tokenizer if self.detokenizer else None)

    def output(self) -> RequestOutput:
        return RequestOutput(self.id, self.prompt, list(self.prompt_ids), self.text, list(self.output_ids),
                             self.finish_reason or "", self.metrics, self.error, self.logprobs_from(0),
                             self.cumulative_logprob, self.decoded_prompt_logprobs())

    def decoded_prompt_logprobs(self) -> Optional[list[Optional[TokenLogprobs]]]:
        """``prompt_logprobs`` with their tokens' text decoded (None when not asked for)."""
        if self.prompt_logprobs is None:
            return None
        tokenizer = self.detokenizer.tokenizer if self.detokenizer else None
        return [None] + decode_tokens(self.prompt_logprobs[1:], tokenizer)
