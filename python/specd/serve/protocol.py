"""OpenAI-compatible request bodies (``/v1/completions``, ``/v1/chat/completions``) and what
they become: SamplingParams, and the response and stream-chunk objects.

Rules:
- Fields follow OpenAI's API, with vLLM's extra sampling fields (top_k, min_p, min_tokens,
  repetition_penalty, ignore_eos, stop_token_ids). Unknown fields are ignored, as vLLM
  does; fields that would change the result and are not supported (best_of above 1,
  suffix) are refused with a message naming them.
- ``echo``: the prompt's text before the completion's, and with ``logprobs`` the prompt
  tokens' logprobs first (the first token's None: SamplingParams.prompt_logprobs);
  ``max_tokens: 0`` with echo scores the prompt alone (what evaluation harnesses send).
- ``n``: that many choices per prompt (each its own request in the batch; with a seed,
  choice j samples with seed + j). Choice ``i * n + j`` is prompt i's j-th.
- Values are checked by SamplingParams (the message names the field).
- ``logit_bias`` keys are token ids written as strings (OpenAI's form).
- Structured outputs (SamplingParams.structured_outputs): OpenAI's ``response_format``
  (``{"type": "json_object"}``, or ``{"type": "json_schema", "json_schema": {"schema": ...}}``),
  vLLM's ``structured_outputs`` object (``json``, ``regex``, ``choice``, ``grammar``,
  ``json_object``) or its older ``guided_json`` / ``guided_regex`` / ``guided_choice`` /
  ``guided_grammar`` fields; one of them per request.
- Completions ``logprobs: n`` and chat ``logprobs: true`` with ``top_logprobs: n`` return the
  target's raw log-probabilities (SamplingParams.logprobs), in each API's layout.
- A response carries, besides OpenAI's fields, ``specd``: per choice the speculation
  figures of its request (verify steps, drafted and accepted tokens, acceptance rate, mean
  accepted length).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict

from specd.engine.outputs import RequestMetrics, StreamChunk
from specd.engine.params import SamplingParams, StructuredOutputsParams
from specd.errors import InvalidArgumentError


MAX_N = 16  # completions per prompt at most


def choice_params(params: SamplingParams, n: Optional[int]) -> list[SamplingParams]:
    """The parameters of each of a prompt's ``n`` choices (SamplingParams.completions: with a
    seed, choice j gets seed + j, distinct samples, reproducible; without, each request draws
    its own stream)."""
    return dataclasses.replace(params, n=n or 1).completions()


class _Sampling(BaseModel):
    """The sampling fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    n: Optional[int] = 1
    stream: bool = False
    stream_options: Optional[dict[str, Any]] = None
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None
    # vLLM's extra sampling fields
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    min_tokens: Optional[int] = None
    repetition_penalty: Optional[float] = None
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[int]] = None
    # structured outputs: OpenAI's response_format, vLLM's structured_outputs and guided_* fields
    response_format: Optional[dict[str, Any]] = None
    structured_outputs: Optional[dict[str, Any]] = None
    guided_json: Optional[Union[dict[str, Any], str]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None

    def structured(self) -> Optional[StructuredOutputsParams]:
        """The request's output constraint, from whichever field gave it (at most one)."""
        found = []
        rf = self.response_format
        if rf is not None and rf.get("type", "text") != "text":
            if rf.get("type") == "json_object":
                found.append(StructuredOutputsParams(json_object=True))
            elif rf.get("type") == "json_schema":
                schema = (rf.get("json_schema") or {}).get("schema")
                if schema is None:
                    raise InvalidArgumentError("response_format json_schema needs json_schema.schema")
                found.append(StructuredOutputsParams(json=schema))
            else:
                raise InvalidArgumentError(f"response_format type {rf.get('type')!r} is not one of text, "
                                           "json_object, json_schema")
        if self.structured_outputs is not None:
            try:
                found.append(StructuredOutputsParams(**self.structured_outputs))
            except TypeError as e:
                raise InvalidArgumentError(f"structured_outputs: {e}") from None
        for field, value in (("json", self.guided_json), ("regex", self.guided_regex),
                             ("choice", self.guided_choice), ("grammar", self.guided_grammar)):
            if value is not None:
                found.append(StructuredOutputsParams(**{field: value}))
        if len(found) > 1:
            raise InvalidArgumentError("give one of response_format, structured_outputs and the guided_* fields")
        return found[0] if found else None

    def usage_event(self, rid: str, obj: str, created_at: int, model: str):
        """With ``stream_options: {"include_usage": true}``: the stream's last event before
        [DONE], as a function of the usage (no choices); else None."""
        if not (self.stream_options or {}).get("include_usage"):
            return None
        return lambda use: {"id": rid, "object": obj, "created": created_at, "model": model, "choices": [],
                            "usage": use}

    def sampling_params(self, max_tokens: Optional[int], logprobs: Optional[int], default_max_tokens: int
                        ) -> SamplingParams:
        if self.n is not None and not (isinstance(self.n, int) and 1 <= self.n <= MAX_N):
            raise InvalidArgumentError(f"n must be an int in [1, {MAX_N}], got {self.n}")
        bias = None
        if self.logit_bias:
            try:
                bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except ValueError:
                raise InvalidArgumentError("logit_bias keys must be token ids (integers written as strings), "
                                           f"got {list(self.logit_bias)!r}") from None
        fields = dict(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                      seed=self.seed, presence_penalty=self.presence_penalty,
                      frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
                      min_tokens=self.min_tokens, ignore_eos=self.ignore_eos, stop_token_ids=self.stop_token_ids,
                      stop=self.stop, logit_bias=bias, logprobs=logprobs, structured_outputs=self.structured())
        given = {k: v for k, v in fields.items() if v is not None}
        return SamplingParams(max_tokens=default_max_tokens if max_tokens is None else max_tokens, **given)


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = 16
    logprobs: Optional[int] = None
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    def prompts(self) -> list:
        """One prompt (text or token ids) per completion."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        if not p:
            raise InvalidArgumentError("prompt is empty")
        return list(p)

    @property
    def scores_only(self) -> bool:
        """``echo`` with ``max_tokens: 0``: the prompt and its logprobs, nothing generated (one
        token is generated and dropped)."""
        return self.echo and self.max_tokens == 0

    def params(self, default_max_tokens: int) -> SamplingParams:
        for name, bad in (("suffix", self.suffix is not None), ("best_of", self.best_of not in (None, 1))):
            if bad:
                raise InvalidArgumentError(f"{name} is not supported")
        params = self.sampling_params(1 if self.scores_only else self.max_tokens, self.logprobs, default_max_tokens)
        if self.echo and self.logprobs is not None:
            params = dataclasses.replace(params, prompt_logprobs=self.logprobs)
        return params


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: Union[str, list[dict[str, Any]], None] = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise InvalidArgumentError(f"message content of type {part.get('type')!r} is not supported "
                                           "(text only)")
            parts.append(part.get("text", ""))
        return "".join(parts)


class ChatRequest(_Sampling):
    messages: list[ChatMessage]
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None

    def params(self, default_max_tokens: int) -> SamplingParams:
        if not self.messages:
            raise InvalidArgumentError("messages is empty")
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidArgumentError("top_logprobs needs logprobs: true")
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self.sampling_params(max_tokens, (self.top_logprobs or 0) if self.logprobs else None,
                                    default_max_tokens)

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]


# ---- responses ----

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def error_body(message: str, kind: str = "invalid_request_error", code: int = 400) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def speculation(metrics: Optional[RequestMetrics]) -> Optional[dict]:
    if metrics is None:
        return None
    return {"verify_steps": metrics.verify_steps, "draft_tokens": metrics.draft_tokens,
            "accepted_tokens": metrics.accepted_tokens, "acceptance_rate": metrics.acceptance_rate,
            "mean_accepted_length": metrics.mean_accepted_length}


def completion_logprobs(chunk: StreamChunk, offset: int, top: int) -> Optional[dict]:
    """The legacy completions layout of a chunk's logprobs (``offset``: the text's length
    before it; ``top``: alternatives per token)."""
    if chunk.logprobs is None:
        return None
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, entry, piece in zip(chunk.token_ids, chunk.logprobs, chunk.pieces):
        chosen = entry[token]
        out["tokens"].append(chosen.decoded_token)
        out["token_logprobs"].append(chosen.logprob)
        out["top_logprobs"].append({lp.decoded_token: lp.logprob for _, lp in _ranked(entry)[:top]})
        out["text_offset"].append(offset)
        offset += len(piece)
    return out


def prompt_completion_logprobs(prompt_ids: list[int], entries: list, tokenizer, top: int) -> dict:
    """The legacy completions layout of a prompt's logprobs (echo): the first token has none."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for j, token in enumerate(prompt_ids):
        entry = entries[j] if j < len(entries) else None
        text = entry[token].decoded_token if entry else (tokenizer.decode([token]) if tokenizer else "")
        out["tokens"].append(text)
        out["token_logprobs"].append(entry[token].logprob if entry else None)
        out["top_logprobs"].append({lp.decoded_token: lp.logprob for _, lp in _ranked(entry)[:top]} if entry else None)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def chat_logprobs(chunk: StreamChunk, top: int) -> Optional[dict]:
    if chunk.logprobs is None:
        return None
    content = []
    for token, entry in zip(chunk.token_ids, chunk.logprobs):
        chosen = entry[token]
        content.append({"token": chosen.decoded_token, "logprob": chosen.logprob,
                        "bytes": list(chosen.decoded_token.encode("utf-8")),
                        "top_logprobs": [{"token": lp.decoded_token, "logprob": lp.logprob,
                                          "bytes": list(lp.decoded_token.encode("utf-8"))}
                                         for _, lp in _ranked(entry)[:top]]})
    return {"content": content}


def _ranked(entry: dict) -> list:
    return sorted(entry.items(), key=lambda kv: (kv[1].rank, kv[0]))


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens``: prompt tokens served
    from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def created() -> int:
    return int(time.time())
