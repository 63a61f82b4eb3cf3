"""An LLM driven by one engine thread, for asyncio servers: ``AsyncLLM.generate`` yields a
request's StreamChunks as the engine steps.

Rules:
- Only the engine thread touches the LLM (LLM is not thread-safe). Other threads send it
  commands (add, abort, call) through a queue; it runs them between steps, then steps while
  any request is unfinished, and sleeps on the queue when idle (no busy loop).
- A request's chunks reach its asyncio loop with ``call_soon_threadsafe``; the final chunk
  (``finished``) ends the stream. A consumer that stops early (a client that disconnects:
  the async generator is closed) aborts its request, freeing its KV at the next step;
  other requests are unaffected.
- A rejected request (bad parameters, a prompt too long) raises the LLM's error
  (InvalidArgumentError) from ``generate`` before anything streams. If a step raises, every
  request in flight ends with a final chunk whose ``error`` says so (finish_reason
  "error"), the LLM's requests are aborted, and the thread goes on serving new ones.
- ``close`` stops the thread after aborting what is in flight.
- On a CUDA device the engine thread makes the target's device its current one (a new
  thread's is device 0), so graph captures and replays use the model's device and streams.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import AsyncIterator, Callable, Optional

from specd.engine.llm import LLM
from specd.engine.outputs import StreamChunk
from specd.engine.params import SamplingParams


class AsyncLLM:
    def __init__(self, llm: LLM):
        self.llm = llm
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._closed = False
        self.aborted = 0  # requests aborted because their consumer left early
        self._thread = threading.Thread(target=self._run, name="specd-engine", daemon=True)
        self._thread.start()

    # ---- caller side (any thread / event loop) ----

    async def add(self, prompt, params: SamplingParams, follows: Optional["RequestStream"] = None) -> "RequestStream":
        """Queues a request; its chunks come from the returned stream. Raises the LLM's error
        when it rejects the request (nothing is queued then). ``follows``: the stream of a
        request with the same prompt whose computed prompt this one may adopt
        (LLM.add_request's ``follows``)."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue = asyncio.Queue()
        leader = follows.request_id if follows is not None else None
        rid, prompt_ids = await self._submit(lambda: self._add(prompt, params, loop, chunks, leader))
        return RequestStream(self, rid, prompt_ids, chunks)

    async def generate(self, prompt, params: SamplingParams) -> AsyncIterator[StreamChunk]:
        """``add`` then the request's chunks, the last one ``finished``."""
        stream = await self.add(prompt, params)
        async with stream:
            async for chunk in stream:
                yield chunk

    async def call(self, fn: Callable[[LLM], object]):
        """``fn(llm)`` run on the engine thread between steps (e.g. ``LLM.metrics``)."""
        return await self._submit(lambda: fn(self.llm))

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._commands.put(None)
            self._thread.join(timeout=30)

    async def _submit(self, fn: Callable[[], object]):
        if self._closed:
            raise RuntimeError("AsyncLLM is closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def run():
            try:
                result = fn()
            except BaseException as e:  # reaches the caller, not the engine thread
                loop.call_soon_threadsafe(_settle, future, None, e)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)
        self._commands.put(run)
        return await future

    # ---- engine thread ----

    def _add(self, prompt, params, loop, chunks, follows: Optional[int] = None) -> tuple[int, list[int]]:
        rid = self.llm.add_request(prompt, params, follows=follows)
        self._streams[rid] = (loop, chunks)
        return rid, self.llm.prompt_token_ids(rid)

    def _abort_later(self, rid: int) -> None:
        if not self._closed:
            self._commands.put(lambda: self._abort(rid))

    def _abort(self, rid: int) -> None:
        if rid in self._streams and self.llm.abort_request(rid):  # its final chunk comes next step
            self.aborted += 1

    def _run(self) -> None:
        device = getattr(self.llm.target, "device", None)
        if device is not None and device.type == "cuda":  # a thread starts on device 0: use the model's
            import torch

            torch.cuda.set_device(device)
        while True:
            busy = self.llm.has_unfinished_requests()
            try:
                command = self._commands.get(block=not busy)
            except queue.Empty:
                command = False
            while command is not False:
                if command is None:  # close
                    self._fail_all("the server is shutting down")
                    return
                command()
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = False
            if self.llm.has_unfinished_requests():
                self._step()

    def _step(self) -> None:
        try:
            chunks = self.llm.step()
        except Exception as e:  # the step failed: end every request in flight with its reason
            self._fail_all(f"engine step failed: {type(e).__name__}: {e}")
            return
        self._deliver(chunks)

    def _deliver(self, chunks: list[StreamChunk]) -> None:
        """Hands the chunks to their streams: one wake-up per event loop for the whole step."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for chunk in chunks:
            target = self._streams.get(chunk.request_id)
            if target is None:
                continue
            if chunk.finished:
                del self._streams[chunk.request_id]
            loop, queue_ = target
            by_loop.setdefault(loop, []).append((queue_, chunk))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _fail_all(self, message: str) -> None:
        for rid in list(self._streams):
            try:
                self.llm.abort_request(rid)
            except Exception:  # already ended
                pass
            self._deliver([StreamChunk(rid, "", [], True, "error", error=message)])
        try:
            self.llm.step()  # drains the aborted requests' final chunks (dropped: already failed)
        except Exception:
            pass


def _put_all(items: list) -> None:
    for chunks, chunk in items:
        chunks.put_nowait(chunk)


def _settle(future: asyncio.Future, result, error: Optional[BaseException]) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class RequestStream:
    """One request's chunks (``async for``), the last one ``finished``. Closing it before
    then (``aclose``, or leaving ``async with``) aborts the request."""

    def __init__(self, owner: AsyncLLM, request_id: int, prompt_token_ids: list[int], chunks: asyncio.Queue):
        self.request_id, self.prompt_token_ids = request_id, prompt_token_ids
        self._owner, self._chunks, self.finished = owner, chunks, False

    def __aiter__(self):
        return self

    async def __anext__(self) -> StreamChunk:
        if self.finished:
            raise StopAsyncIteration
        chunk = await self._chunks.get()
        self.finished = chunk.finished
        return chunk

    async def aclose(self) -> None:
        if not self.finished:
            self.finished = True
            self._owner._abort_later(self.request_id)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
