"""One request's state in the engine: its tokens, KV progress, stop handling and metrics."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Optional

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
        self.ids.append(token)
        prefix = self.decode(self.ids[self.prefix_offset:self.read_offset])
        full = self.decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix):]
        return ""


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
    pieces: list[str] = field(default_factory=list)  # per output token: the text it added
    text: str = ""
    status: Status = Status.WAITING
    finish_reason: Optional[str] = None
    error: Optional[str] = None  # why it failed (finish_reason "error")
    computed: list[int] = field(default_factory=lambda: [0, 0])  # KV committed: target, draft
    in_blocks: bool = False  # holds a sequence in the block manager
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    started: Optional[float] = None
    finished_at: Optional[float] = None
    stream_sent: tuple[int, int] = (0, 0)  # (text chars, tokens) already streamed

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status == Status.FINISHED

    def room(self) -> int:
        """How many more tokens it may emit (max_tokens and the context limit)."""
        return min(self.params.max_tokens - len(self.output_ids), self.max_len - self.length)

    def emit(self, tokens: list[int], num_accepted: int) -> int:
        """Appends this step's tokens (accepted drafts, then the bonus/recovered token), stopping
        at EOS, a stop token or string, max_tokens or the context limit. Returns how many of
        them were kept."""
        kept = 0
        for i, token in enumerate(tokens):
            self.output_ids.append(token)
            self.accepted_flags.append(i < num_accepted)
            kept += 1
            piece = self.detokenizer.push(token) if self.detokenizer is not None else ""
            self.pieces.append(piece)
            self.text += piece
            if (token in self.eos_ids and not self.params.ignore_eos) or token in self.params.stop_token_ids:
                self.finish("stop")
            elif self.detokenizer is not None and self._cut_at_stop_string():
                self.finish("stop")
            elif self.room() <= 0:
                self.finish("length")
            if self.finished:
                break
        self.metrics.generated_tokens = len(self.output_ids)
        return kept

    def _cut_at_stop_string(self) -> bool:
        for stop in self.params.stop:
            at = self.text.find(stop)
            if at >= 0:
                excess = len(self.text) - at
                self.text = self.text[:at]
                for i in range(len(self.pieces) - 1, -1, -1):  # keep "".join(pieces) == text
                    if excess <= 0:
                        break
                    cut = min(excess, len(self.pieces[i]))
                    self.pieces[i] = self.pieces[i][:len(self.pieces[i]) - cut]
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

    def output(self) -> RequestOutput:
        return RequestOutput(self.id, self.prompt, list(self.prompt_ids), self.text, list(self.output_ids),
                             self.finish_reason or "", self.metrics, self.error)
