"""``specd serve``: an OpenAI-compatible HTTP server (specd/serve) over one LLM."""

from __future__ import annotations

import argparse
import os
import sys

from specd.cli.common import add_model_options, resolve_models


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API",
                       description="Serve /v1/completions and /v1/chat/completions (OpenAI's API, streaming "
                                   "included) with speculative decoding; every request joins one continuous "
                                   "batch. Needs FastAPI and uvicorn (pip install specd[serve]).")
    add_model_options(p)
    p.add_argument("--method", default="draft", choices=["draft", "ngram", "suffix", "draft+suffix", "draft+ngram",
                                                         "none"],
                   help="speculation method (default: draft model)")
    p.add_argument("-k", "--num-speculative-tokens", default="auto",
                   help="draft tokens per step, or 'auto' (default): the goodput policy picks k (0 included) per "
                        "request and step from measured acceptance and cost")
    p.add_argument("--draft-tree-width", type=int, default=1, help="with a draft model: 1 = chains; 2..8 = trees")
    p.add_argument("--jump-forward-tokens", type=int, default=8, metavar="N",
                   help="structured outputs: verify the text a request's grammar forces as drafts, up to N tokens, "
                        "in steps where it gets no other drafts (jump-forward decoding; 0 = off; default 8)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="requests in one batch at most (default 32)")
    p.add_argument("--kv-cache-memory", type=int, default=1 << 30, help="bytes of KV cache (default 1 GiB)")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="turn automatic prefix caching off (default on: requests sharing a prompt prefix, e.g. a "
                        "system prompt or earlier chat turns, reuse its KV instead of prefilling it)")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API (default: the "
                   "target's file or directory name)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes (default: "
                   "the SPECD_API_KEY environment variable, else none)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401
        import fastapi  # noqa: F401
    except ImportError:
        print("specd serve: error: needs FastAPI and uvicorn (pip install 'specd[serve]')", file=sys.stderr)
        return 2
    import specd
    from specd.serve import AsyncLLM, make_app

    k = args.num_speculative_tokens
    k = k if k == "auto" else _int(k)
    spec = specd.SpeculationConfig(method=args.method, num_speculative_tokens=k,
                                   draft_tree_width=args.draft_tree_width,
                                   jump_forward_tokens=args.jump_forward_tokens)
    target, draft = resolve_models(args, want_draft="draft" in args.method)
    if "draft" in args.method and draft is None:
        print("specd serve: error: --method draft needs --draft", file=sys.stderr)
        return 2
    llm = specd.LLM(target, draft, spec, dtype=args.dtype, device=args.device, max_num_seqs=args.max_num_seqs,
                    kv_cache_memory=args.kv_cache_memory, enable_prefix_caching=not args.no_prefix_caching)
    name = args.served_model_name or target.name
    app = make_app(AsyncLLM(llm), name, args.api_key or os.environ.get("SPECD_API_KEY") or None)
    print(f"[specd] serving `{name}` on http://{args.host}:{args.port} (speculation: {spec.method_name}, "
          f"k {spec.num_speculative_tokens}, policy {spec.policy})", file=sys.stderr)
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _int(text: str) -> int:
    from specd.errors import InvalidArgumentError

    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"-k must be an int or 'auto', got {text!r}") from None
