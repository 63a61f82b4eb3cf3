"""The OpenAI-compatible HTTP server (FastAPI): ``specd serve``.

Routes: ``GET /health``, ``GET /v1/models``, ``GET /metrics`` (LLM.metrics(), the requests
in flight and those aborted by a client leaving), ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream``:
server-sent events ending with ``data: [DONE]``). Every request joins the one engine's
continuous batch (serve/async_llm.py); a client that disconnects, streaming or not, aborts
its requests.

Errors, in OpenAI's body (``{"error": {"message", "type", "param", "code"}}``): 400 for a bad
body or parameter (the message names it), 401 for a missing or wrong API key (when the server
has one), 404 for another model's name, 500 when a request fails in the engine (a streaming
response then sends an error event before ``[DONE]``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from contextlib import asynccontextmanager
from typing import AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from specd.errors import InvalidArgumentError
from specd.serve import protocol
from specd.serve.async_llm import AsyncLLM, RequestStream


class _RequestFailed(Exception):
    pass


def make_app(engine: AsyncLLM, model_name: str, api_key: Optional[str] = None) -> FastAPI:
    """The app serving ``engine`` under ``model_name``; closing the app closes the engine.
    ``api_key``: the /v1 routes then need ``Authorization: Bearer <api_key>`` (401 otherwise)."""

    @asynccontextmanager
    async def lifespan(_app):
        yield
        engine.close()

    app = FastAPI(title="specd", lifespan=lifespan)
    llm = engine.llm
    chat_max_tokens = llm.max_model_len  # OpenAI's chat default: up to the context limit

    if api_key is not None:
        @app.middleware("http")
        async def _authorize(request: Request, call_next):
            if request.url.path.startswith("/v1") and request.headers.get("authorization") != f"Bearer {api_key}":
                return JSONResponse(protocol.error_body("missing or wrong API key (Authorization: Bearer ...)",
                                                        "AuthenticationError", 401), status_code=401)
            return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(_request, exc: RequestValidationError):
        where = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        return JSONResponse(protocol.error_body(f"invalid request body: {where}"), status_code=400)

    @app.exception_handler(InvalidArgumentError)
    async def _invalid_argument(_request, exc: InvalidArgumentError):
        return JSONResponse(protocol.error_body(str(exc)), status_code=400)

    @app.exception_handler(_RequestFailed)
    async def _failed(_request, exc: _RequestFailed):
        return JSONResponse(protocol.error_body(str(exc), "server_error", 500), status_code=500)

    def check_model(name: Optional[str]) -> Optional[JSONResponse]:
        if name is not None and name != model_name:
            return JSONResponse(protocol.error_body(f"The model `{name}` does not exist (this server has "
                                                    f"`{model_name}`).", "NotFoundError", 404), status_code=404)
        return None

    @app.get("/health")
    async def health():
        return {}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": protocol.created(),
                                            "owned_by": "specd", "max_model_len": llm.max_model_len}]}

    @app.get("/metrics")
    async def metrics():
        return {"requests_in_flight": engine.num_in_flight, "requests_aborted": engine.aborted,
                **(await engine.call(lambda x: x.metrics()))}

    @app.post("/v1/completions")
    async def completions(body: protocol.CompletionRequest, request: Request):
        wrong = check_model(body.model)
        if wrong is not None:
            return wrong
        params = body.params(default_max_tokens=16)
        n = body.n or 1
        prompts = body.prompts()
        streams = await _add_all(engine, [(p, c, j) for p in prompts for j, c in enumerate(protocol.choice_params(params, n))])
        rid, now = protocol.new_id("cmpl"), protocol.created()
        top = params.logprobs or 0
        def echoed(i: int, first_chunk, text: str, logprobs: Optional[dict]) -> tuple[str, Optional[dict]]:
            """With echo: the prompt's text and logprobs before a choice's first text and logprobs."""
            if not body.echo:
                return text, logprobs
            prompt, stream = prompts[i // n], streams[i]
            if isinstance(prompt, str):
                head_text = prompt
            else:  # token ids: their text (none without a tokenizer)
                head_text = llm.tokenizer.decode(stream.prompt_token_ids) if llm.tokenizer is not None else ""
            if logprobs is not None:
                head = protocol.prompt_completion_logprobs(stream.prompt_token_ids, first_chunk.prompt_logprobs,
                                                           llm.tokenizer, top)
                logprobs["text_offset"] = [o + len(head_text) for o in logprobs["text_offset"]]
                logprobs = {key: head[key] + logprobs[key] for key in head}
            return head_text + text, logprobs

        def scored(chunk):
            """A chunk without its generated part, for echo with max_tokens 0 (one token was made)."""
            if not body.scores_only:
                return chunk
            return dataclasses.replace(chunk, text="", token_ids=[], pieces=[], accepted=[],
                                       logprobs=None if chunk.logprobs is None else [])

        if body.stream:
            offsets = [0] * len(streams)

            def event(i: int, chunk) -> dict:
                chunk = scored(chunk)
                text, logprobs = chunk.text, protocol.completion_logprobs(chunk, offsets[i], top)
                if i not in sent:  # a choice's first event: the echoed prompt first
                    sent.add(i)
                    text, logprobs = echoed(i, chunk, text, logprobs)
                offsets[i] += len(text)
                choice = {"index": i, "text": text, "finish_reason": chunk.finish_reason if chunk.finished else None,
                          "logprobs": logprobs}
                return {"id": rid, "object": "text_completion", "created": now, "model": model_name,
                        "choices": [choice]}
            sent: set[int] = set()
            return _sse(streams, event, body.usage_event(rid, "text_completion", now, model_name))
        results = [[scored(c) for c in chunks] for chunks in await _collect_all(streams, request)]
        choices, spec = [], []
        for i, (stream, chunks) in enumerate(zip(streams, results)):
            text, merged = echoed(i, chunks[0], "".join(c.text for c in chunks), _merge_logprobs(chunks, top))
            choices.append({"index": i, "text": text, "finish_reason": chunks[-1].finish_reason,
                            "logprobs": merged})
            spec.append(protocol.speculation(chunks[-1].metrics))
        return {"id": rid, "object": "text_completion", "created": now, "model": model_name, "choices": choices,
                "usage": _usage(streams, results), "specd": spec}

    @app.post("/v1/chat/completions")
    async def chat(body: protocol.ChatRequest, request: Request):
        wrong = check_model(body.model)
        if wrong is not None:
            return wrong
        params = body.params(default_max_tokens=chat_max_tokens)
        tokenizer = llm.tokenizer
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise InvalidArgumentError(f"the model `{model_name}` has no chat template: use /v1/completions")
        try:
            prompt = tokenizer.apply_chat_template(body.conversation(), tokenize=False, add_generation_prompt=True)
        except Exception as e:  # the template's own checks (e.g. roles must alternate)
            raise InvalidArgumentError(f"the chat template refused the messages: {type(e).__name__}: {e}") from None
        streams = await _add_all(engine, [(prompt, c, j) for j, c in enumerate(protocol.choice_params(params, body.n))])
        rid, now = protocol.new_id("chatcmpl"), protocol.created()
        top = params.logprobs or 0
        if body.stream:
            started = set()

            def event(i: int, chunk) -> dict:
                delta = {"content": chunk.text} if i in started else {"role": "assistant", "content": chunk.text}
                started.add(i)
                choice = {"index": i, "delta": delta, "finish_reason": chunk.finish_reason if chunk.finished else None,
                          "logprobs": protocol.chat_logprobs(chunk, top)}
                return {"id": rid, "object": "chat.completion.chunk", "created": now, "model": model_name,
                        "choices": [choice]}
            return _sse(streams, event, body.usage_event(rid, "chat.completion.chunk", now, model_name))
        results = await _collect_all(streams, request)
        choices = []
        for i, chunks in enumerate(results):
            logprobs = None
            if params.logprobs is not None:
                logprobs = {"content": [c for ch in chunks for c in protocol.chat_logprobs(ch, top)["content"]]}
            choices.append({"index": i, "message": {"role": "assistant", "content": "".join(c.text for c in chunks)},
                            "finish_reason": chunks[-1].finish_reason, "logprobs": logprobs})
        return {"id": rid, "object": "chat.completion", "created": now, "model": model_name, "choices": choices,
                "usage": _usage(streams, results), "specd": [protocol.speculation(c[-1].metrics) for c in results]}

    return app


async def _add_all(engine: AsyncLLM, requests: list[tuple]) -> list[RequestStream]:
    """Every (prompt, params, choice index)'s request, or none: a rejected one aborts those
    already added. A prompt's choices after the first follow its first (AsyncLLM.add's
    ``follows``: the prompt is prefilled once)."""
    streams: list[RequestStream] = []
    first = None
    try:
        for prompt, params, choice in requests:
            if choice == 0:
                first = None
            stream = await engine.add(prompt, params, follows=first)
            first = first or stream
            streams.append(stream)
    except BaseException:
        for s in streams:
            await s.aclose()
        raise
    return streams


async def _collect(stream: RequestStream) -> list:
    async with stream:
        chunks = [c async for c in stream]
    if chunks[-1].finish_reason == "error":
        raise _RequestFailed(chunks[-1].error or "the request failed")
    return chunks


async def _collect_all(streams: list[RequestStream], request: Request) -> list[list]:
    """Every stream's chunks. A client that disconnects first aborts its requests (checked
    every 0.2 s while they run); the response is then not sent."""
    gathered = asyncio.ensure_future(asyncio.gather(*(_collect(s) for s in streams)))

    async def watch():
        while not gathered.done():
            if await request.is_disconnected():
                gathered.cancel()
                return
            await asyncio.sleep(0.2)
    watcher = asyncio.create_task(watch())
    try:
        return list(await gathered)
    finally:
        watcher.cancel()
        for s in streams:
            await s.aclose()


def _merge_logprobs(chunks: list, top: int) -> Optional[dict]:
    if chunks[0].logprobs is None:
        return None
    merged, offset = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}, 0
    for c in chunks:
        part = protocol.completion_logprobs(c, offset, top)
        for key in merged:
            merged[key] += part[key]
        offset += len(c.text)
    return merged


def _usage(streams: list[RequestStream], results: list[list]) -> dict:
    return protocol.usage(sum(len(s.prompt_token_ids) for s in streams),
                          sum(len(c.token_ids) for chunks in results for c in chunks),
                          sum(_cached(chunks[-1]) for chunks in results))


def _cached(final_chunk) -> int:
    """Prompt tokens of a request served from the prefix cache (its final chunk's metrics)."""
    return final_chunk.metrics.cached_tokens if final_chunk.metrics is not None else 0


def _sse(streams: list[RequestStream], event, usage_event=None) -> StreamingResponse:
    """Server-sent events of every stream's chunks as they come (``event(index, chunk)``), then
    ``usage_event(usage)`` when given (``stream_options.include_usage``), then ``[DONE]``; a
    failed request sends an error event. Leaving early aborts the requests."""

    async def body() -> AsyncIterator[str]:
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, stream: RequestStream):
            async for chunk in stream:
                await merged.put((i, chunk))
        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        try:
            left, generated, cached = len(streams), 0, 0
            while left:
                i, chunk = await merged.get()
                generated += len(chunk.token_ids)
                if chunk.finished:
                    left -= 1
                    cached += _cached(chunk)
                if chunk.finish_reason == "error":
                    yield _data(protocol.error_body(chunk.error or "the request failed", "server_error", 500))
                    continue
                yield _data(event(i, chunk))
            if usage_event is not None:
                yield _data(usage_event(protocol.usage(sum(len(s.prompt_token_ids) for s in streams), generated,
                                                       cached)))
            yield "data: [DONE]\n\n"
        finally:
            for t in tasks:
                t.cancel()
            for s in streams:
                await s.aclose()

    return StreamingResponse(body(), media_type="text/event-stream")


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"
