"""A client-side serving benchmark for any OpenAI-compatible server (``specd bench serve``):
specd serve, vLLM, SGLang, TensorRT-LLM's trtllm-serve or llama.cpp's server, measured the
same way, so deployments can be compared side by side on one machine.

Rules:
- Requests (the built-in prompts, raw text, cycled) arrive as a Poisson process at ``rate``
  requests/s (``inf``: all at once), from a seeded generator: every server gets the same
  arrival times. Each request is one HTTP connection; streamed by default, with
  ``stream_options.include_usage`` so the server reports the tokens it generated.
- Per request: TTFT (request sent -> first event with text), E2E (sent -> last byte), output
  tokens (the usage event's ``completion_tokens``; without one, the count of events with
  text, flagged as estimated), TPOT = (E2E - TTFT) / (tokens - 1), and the gaps between
  events with text (ITL; a speculative server sends several tokens per event).
- Summary: completed and failed requests, duration (first arrival -> last completion),
  requests/s and output tokens/s, and mean / p50 / p99 of TTFT, TPOT, ITL and E2E (ms); with
  servers that report it (``usage.prompt_tokens_details.cached_tokens``: specd, vLLM with
  prefix caching), the share of prompt tokens served from the prefix cache.
- Greedy by default (temperature 0, ``ignore_eos``: every request generates ``max_tokens``,
  so servers do the same work); failures (HTTP errors, error events) are counted, not
  retried.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from typing import Optional


@dataclass
class RequestResult:
    ok: bool = False
    error: Optional[str] = None
    sent: float = 0.0            # seconds since the run started
    ttft: Optional[float] = None  # seconds
    e2e: Optional[float] = None
    output_tokens: int = 0
    estimated_tokens: bool = False  # no usage event: tokens counted as events with text
    prompt_tokens: Optional[int] = None  # the usage's, when the server reports it
    cached_tokens: Optional[int] = None  # usage.prompt_tokens_details.cached_tokens, when reported
    gaps: list[float] = field(default_factory=list)  # seconds between events with text


@dataclass(frozen=True)
class ServingConfig:
    url: str                    # the server's base URL, e.g. http://127.0.0.1:8000
    model: Optional[str] = None  # None: the first of /v1/models
    rate: float = math.inf      # requests/s (Poisson); inf: all at once
    requests: int = 32
    max_tokens: int = 128
    chat: bool = False          # /v1/chat/completions (the prompt as one user message)
    stream: bool = True
    temperature: float = 0.0
    seed: int = 0
    timeout_s: float = 600.0
    api_key: Optional[str] = None  # sent as Authorization: Bearer


def served_model(url: str, timeout_s: float = 30.0, api_key: Optional[str] = None) -> str:
    """The first model the server lists (GET /v1/models)."""
    status, body = _request(url, "GET", "/v1/models", None, timeout_s, api_key)
    if status != 200:
        raise RuntimeError(f"GET {url}/v1/models: HTTP {status}: {body[:200]!r}")
    return json.loads(body)["data"][0]["id"]


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """Seconds after the start at which each of n requests is sent (Poisson at ``rate``)."""
    if math.isinf(rate):
        return [0.0] * n
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def run(config: ServingConfig, prompts: list[str]) -> dict:
    """Sends the requests and returns {"config", "summary", "requests"}."""
    model = config.model or served_model(config.url, config.timeout_s, config.api_key)
    times = arrival_times(config.requests, config.rate, config.seed)
    results = [RequestResult() for _ in times]
    threads = []
    start = time.perf_counter()
    for i, at in enumerate(times):
        delay = start + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        body = _body(config, model, prompts[i % len(prompts)])
        t = threading.Thread(target=_one, args=(config, body, results[i], start), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    duration = max((r.sent + (r.e2e or 0.0) for r in results), default=0.0)
    cfg = asdict(config)
    cfg["model"], cfg["rate"] = model, None if math.isinf(config.rate) else config.rate
    return {"config": cfg, "summary": summarize(results, duration),
            "requests": [asdict(r) for r in results]}


def summarize(results: list[RequestResult], duration: float) -> dict:
    done = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in done)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1 and r.ttft is not None]
    out = {"completed": len(done), "failed": len(results) - len(done), "duration_s": duration,
           "requests_per_s": len(done) / duration if duration > 0 else 0.0,
           "output_tokens": tokens, "output_tokens_per_s": tokens / duration if duration > 0 else 0.0,
           "tokens_estimated": any(r.estimated_tokens for r in done),
           **_cache_share(done),
           "errors": sorted({r.error for r in results if r.error})[:5]}
    for name, values in (("ttft", [r.ttft for r in done if r.ttft is not None]), ("tpot", tpot),
                         ("itl", [g for r in done for g in r.gaps]), ("e2e", [r.e2e for r in done])):
        out[f"{name}_ms"] = _stats([v * 1e3 for v in values])
    return out


def _cache_share(done: list[RequestResult]) -> dict:
    """Prompt tokens and those served from the prefix cache, over the requests whose server
    reported both (None when none did)."""
    known = [r for r in done if r.prompt_tokens is not None and r.cached_tokens is not None]
    if not known:
        return {"prompt_tokens": None, "cached_prompt_tokens": None, "prefix_cache_hit_share": None}
    prompt, cached = sum(r.prompt_tokens for r in known), sum(r.cached_tokens for r in known)
    return {"prompt_tokens": prompt, "cached_prompt_tokens": cached,
            "prefix_cache_hit_share": cached / prompt if prompt else 0.0}


def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    s = sorted(values)

    def pct(p: float) -> float:  # nearest rank
        return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]
    return {"mean": sum(s) / len(s), "p50": pct(50), "p99": pct(99)}


def _body(config: ServingConfig, model: str, prompt: str) -> tuple[str, dict]:
    body = {"model": model, "max_tokens": config.max_tokens, "temperature": config.temperature,
            "ignore_eos": True, "stream": config.stream}
    if config.stream:
        body["stream_options"] = {"include_usage": True}
    if config.chat:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**body, "prompt": prompt}


def _one(config: ServingConfig, request: tuple[str, dict], result: RequestResult, start: float) -> None:
    path, body = request
    sent = time.perf_counter()
    result.sent = sent - start
    try:
        parts = urllib.parse.urlsplit(config.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=config.timeout_s)
        conn.request("POST", (parts.path.rstrip("/") or "") + path, json.dumps(body), _headers(config.api_key))
        response = conn.getresponse()
        if response.status != 200:
            result.error = f"HTTP {response.status}: {response.read()[:200]!r}"
            return
        if config.stream:
            _read_stream(response, result, sent, config.chat)
        else:
            data = json.loads(response.read())
            result.ttft = result.e2e = time.perf_counter() - sent
            _read_usage(result, data["usage"])
            result.ok = True
        conn.close()
    except (OSError, ValueError, KeyError, http.client.HTTPException) as e:
        result.error = f"{type(e).__name__}: {e}"


def _read_stream(response, result: RequestResult, sent: float, chat: bool) -> None:
    last, events, usage = None, 0, None
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        now = time.perf_counter()
        data = json.loads(line[6:])
        if "error" in data:
            result.error = f"error event: {data['error'].get('message')}"
            return
        if data.get("usage"):
            usage = data["usage"]
        for choice in data.get("choices", []):
            text = choice.get("delta", {}).get("content") if chat else choice.get("text")
            if text:
                if result.ttft is None:
                    result.ttft = now - sent
                else:
                    result.gaps.append(now - last)
                last = now
                events += 1
    result.e2e = time.perf_counter() - sent
    if usage is not None:
        _read_usage(result, usage)
    else:
        result.output_tokens, result.estimated_tokens = events, True
    result.ok = True


def _read_usage(result: RequestResult, usage: dict) -> None:
    result.output_tokens = usage["completion_tokens"]
    result.prompt_tokens = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details") or {}
    result.cached_tokens = details.get("cached_tokens")


def _headers(api_key: Optional[str]) -> dict:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _request(url: str, method: str, path: str, body: Optional[dict], timeout_s: float,
             api_key: Optional[str] = None) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s)
    conn.request(method, (parts.path.rstrip("/") or "") + path, None if body is None else json.dumps(body),
                 _headers(api_key))
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def _share(summary: dict) -> str:
    """The prefix cache's share of the prompt tokens, or - when the server does not say."""
    share = summary.get("prefix_cache_hit_share")
    return "-" if share is None else f"{100 * share:.0f}%"


def table(runs: list[dict]) -> str:
    """One line per run (rate)."""
    head = (f"{'rate':>6} {'done':>5} {'fail':>4} {'req/s':>7} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
            f"{'TPOT p50':>9} {'ITL p50':>8} {'E2E p50':>9} {'E2E p99':>9}  (ms) {'cached':>7}")
    lines = [head]
    for run_ in runs:
        s, rate = run_["summary"], run_["config"]["rate"]

        def ms(key, p):
            v = s[key][p]
            return "-" if v is None else f"{v:.1f}"
        lines.append(f"{'inf' if rate is None else f'{rate:g}':>6} {s['completed']:>5} {s['failed']:>4} "
                     f"{s['requests_per_s']:>7.2f} {s['output_tokens_per_s']:>8.1f} {ms('ttft_ms', 'p50'):>9} "
                     f"{ms('ttft_ms', 'p99'):>9} {ms('tpot_ms', 'p50'):>9} {ms('itl_ms', 'p50'):>8} "
                     f"{ms('e2e_ms', 'p50'):>9} {ms('e2e_ms', 'p99'):>9}       {_share(s):>7}")
    return "\n".join(lines)
