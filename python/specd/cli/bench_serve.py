"""``specd bench serve``: latency and throughput of any OpenAI-compatible server under Poisson
load (see specd.bench.serving)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from specd.cli.common import positive_floats


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve", help="latency and throughput of an OpenAI-compatible server (specd serve, vLLM, SGLang, ...)",
        description="Sends the built-in prompts (raw text, cycled) to a running OpenAI-compatible server as a "
                    "Poisson process at each rate, streamed, greedy, max_tokens each (ignore_eos), and reports "
                    "requests/s, output tokens/s, TTFT, TPOT, inter-event latency and end-to-end latency (mean, "
                    "p50, p99). The same arrivals for every server: run it against each and compare.")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    p.add_argument("--model", default=None, help="the model name to send (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY' (default: the "
                   "OPENAI_API_KEY environment variable, else none)")
    p.add_argument("--rates", type=positive_floats, default=[math.inf], help="requests/s, comma-separated; inf = all at "
                   "once (default inf)")
    p.add_argument("--requests", type=int, default=32, help="requests per rate (default 32)")
    p.add_argument("--kinds", default="completion,edit,chat",
                   help="which built-in prompts, comma-separated (default: all three kinds)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--chat", action="store_true", help="/v1/chat/completions instead of /v1/completions")
    p.add_argument("--no-stream", action="store_true", help="non-streamed requests (TTFT = E2E)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0, help="seed of the arrival times")
    p.add_argument("--json", type=Path, help="write every run (summary and per-request results) here")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specd.bench import serving
    from specd.bench.prompts import load_prompts

    if args.requests < 1 or args.max_tokens < 1:
        print("specd bench serve: error: --requests and --max-tokens must be >= 1", file=sys.stderr)
        return 2
    kinds = {k.strip() for k in args.kinds.split(",") if k.strip()}
    if not kinds or not kinds <= {"completion", "edit", "chat"}:
        print(f"specd bench serve: error: --kinds must name completion, edit or chat, got {args.kinds!r}",
              file=sys.stderr)
        return 2
    prompts = [p.text for p in load_prompts(None) if p.kind in kinds]
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or None
    try:
        model = args.model or serving.served_model(args.url, api_key=api_key)
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        print(f"specd bench serve: error: cannot reach {args.url}: {e}", file=sys.stderr)
        return 2
    runs = []
    for rate in args.rates:
        config = serving.ServingConfig(url=args.url, model=model, rate=rate, requests=args.requests,
                                       max_tokens=args.max_tokens, chat=args.chat, stream=not args.no_stream,
                                       temperature=args.temperature, seed=args.seed, api_key=api_key)
        runs.append(serving.run(config, prompts))
        print(f"[specd bench serve] rate {rate:g}: {runs[-1]['summary']['completed']} done", file=sys.stderr)
    print(f"specd bench serve: {args.url} model `{model}`, {args.requests} requests per rate, {args.max_tokens} "
          f"tokens each, {'chat' if args.chat else 'completions'}, {'not ' if args.no_stream else ''}streamed")
    print(serving.table(runs))
    if any(r["summary"]["tokens_estimated"] for r in runs):
        print("(no usage events from the server: output tokens counted as events with text)")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs}, indent=1))
    return 0 if all(r["summary"]["failed"] == 0 for r in runs) else 1
