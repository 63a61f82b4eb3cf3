"""An app served by uvicorn on a background thread (tests, benchmarks, notebooks)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator


@contextlib.contextmanager
def serving_in_thread(app, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0) -> Iterator[int]:
    """Serves ``app`` (port 0: a free one) until the block ends; yields the port it listens on.
    Raises RuntimeError when the server does not start within ``start_timeout_s``."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="critical"))
    failure: list[BaseException] = []

    def run():
        try:
            server.run()
        except BaseException as e:  # uvicorn exits (SystemExit) when it cannot bind
            failure.append(e)
    thread = threading.Thread(target=run, name="specd-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            why = f": {type(failure[0]).__name__} {failure[0]}" if failure else ""
            raise RuntimeError(f"the server did not start on {host}:{port}{why}")
        time.sleep(0.02)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
