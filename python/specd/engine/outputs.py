"""What the engine returns: per-request outputs, their metrics, and streaming chunks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from specd.engine.logprobs import TokenLogprobs


@dataclass
class RequestMetrics:
    """Speculation and speed figures of one request.

    verify_steps: target forward passes that decided tokens for it.
    draft_tokens / accepted_tokens: drafts proposed (tree nodes) / accepted.
    acceptance_rate: accepted_tokens / draft_tokens (0 when nothing was proposed).
    mean_accepted_length: generated tokens per verify step (accepted + bonus); 1.0 without
        speculation.
    accepted_per_position: how often the draft at depth 1, 2, ... was accepted.
    tokens_per_s: generated tokens / seconds from the first scheduled step to the end.
    preemptions: times its KV was freed for lack of pages (and recomputed).
    cached_tokens: prompt tokens whose target KV came from the prefix cache when it was first
        admitted (not computed for it; 0 without prefix caching).
    prefilled_tokens: target tokens it fed as prefill (its prompt less the cached part, plus
        any recomputation after preemption).
    k_per_step / methods_per_step / predicted_tokens / realised_tokens: per verify step, the
        speculation policy's choice, its expected tokens and the tokens actually generated.
    """

    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    generated_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    preemptions: int = 0
    cached_tokens: int = 0
    prefilled_tokens: int = 0
    seconds: float = 0.0
    # Telemetry per verify step: the k chosen, its proposer, the tokens the policy expected
    # the step to yield, and the tokens it did yield (accepted drafts + bonus).
    k_per_step: list[int] = field(default_factory=list)
    methods_per_step: list[str] = field(default_factory=list)
    predicted_tokens: list[float] = field(default_factory=list)
    realised_tokens: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.generated_tokens / self.verify_steps if self.verify_steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {"verify_steps": self.verify_steps, "draft_tokens": self.draft_tokens,
                "accepted_tokens": self.accepted_tokens, "generated_tokens": self.generated_tokens,
                "acceptance_rate": self.acceptance_rate, "mean_accepted_length": self.mean_accepted_length,
                "accepted_per_position": list(self.accepted_per_position), "preemptions": self.preemptions,
                "cached_tokens": self.cached_tokens, "prefilled_tokens": self.prefilled_tokens,
                "tokens_per_s": self.tokens_per_s, "seconds": self.seconds,
                "k_per_step": list(self.k_per_step), "methods_per_step": list(self.methods_per_step),
                "predicted_tokens": list(self.predicted_tokens), "realised_tokens": list(self.realised_tokens)}


@dataclass
class CompletionOutput:
    """One of a prompt's ``SamplingParams.n`` completions (vLLM's CompletionOutput): its index,
    text, tokens, finish reason, error, logprobs and metrics, as RequestOutput's fields."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    metrics: RequestMetrics
    error: Optional[str] = None
    logprobs: Optional[list[TokenLogprobs]] = None
    cumulative_logprob: Optional[float] = None


@dataclass
class RequestOutput:
    request_id: int
    prompt: Optional[str]
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str          # "stop" (stop string/token or EOS), "length" (max_tokens / context),
                                # "error" (this request failed; see error)
    metrics: RequestMetrics
    error: Optional[str] = None  # with finish_reason "error": what failed, naming the request
    # With SamplingParams.logprobs: per token of token_ids, token id -> Logprob (the chosen
    # token and the top ones; engine/logprobs.py), and the chosen tokens' sum. Else None.
    logprobs: Optional[list[TokenLogprobs]] = None
    cumulative_logprob: Optional[float] = None
    # With SamplingParams.prompt_logprobs: per prompt token, as logprobs (the first: None).
    prompt_logprobs: Optional[list[Optional[TokenLogprobs]]] = None
    # Every completion of the prompt (SamplingParams.n of them, in index order); the fields
    # above (text, token_ids, finish_reason, metrics, error, logprobs) are completion 0's.
    outputs: list[CompletionOutput] = field(default_factory=list)

    def __post_init__(self):
        if not self.outputs:
            self.outputs = [CompletionOutput(0, self.text, self.token_ids, self.finish_reason, self.metrics,
                                             self.error, self.logprobs, self.cumulative_logprob)]

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache (vLLM's RequestOutput.num_cached_tokens)."""
        return self.metrics.cached_tokens


@dataclass
class StreamChunk:
    """Incremental output of one request: the new text and tokens since the last chunk."""

    request_id: int
    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: Optional[str] = None
    accepted: list[bool] = field(default_factory=list)  # per new token: was it an accepted draft?
    pieces: list[str] = field(default_factory=list)     # per new token: the text it added
    metrics: Optional[RequestMetrics] = None             # on the final chunk
    error: Optional[str] = None                          # on a final chunk with finish_reason "error"
    logprobs: Optional[list[TokenLogprobs]] = None       # per new token, with SamplingParams.logprobs
    # On a request's first chunk, with SamplingParams.prompt_logprobs: per prompt token (the first: None).
    prompt_logprobs: Optional[list[Optional[TokenLogprobs]]] = None
