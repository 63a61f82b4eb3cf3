"""``specd bench``: the main job. specd and HF transformers side by side on the same weights."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specd.cli.common import add_model_options, resolve_models


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark speculative decoding against plain decoding and HF transformers",
                       description="Greedy, batch 1, on the built-in prompt set (code completion and editing "
                                   "from the Python standard library, chat). Measures in one run, interleaved, "
                                   "the median of --reps repetitions: specd without speculation, with the draft "
                                   "model (k=1..8), ngram and suffix; HF transformers plain, assisted "
                                   "(assistant_model) and prompt lookup on the same weights.")
    add_model_options(p)
    p.add_argument("--quick", action="store_true",
                   help="a reduced set: 1 short prompt, 16 tokens, specd none / draft k=3 / ngram / suffix, "
                        "HF plain / assisted")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median reported, >= 1; default 3)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per prompt (default 48, --quick 16)")
    p.add_argument("--no-hf", action="store_true", help="skip the HF transformers runs")
    p.add_argument("--json", type=Path, help="write the results as JSON here")
    p.add_argument("--plot", type=Path, help="write PNG plots into this directory")
    p.set_defaults(run=run)
    from specd.cli import bench_load, bench_serve

    commands = p.add_subparsers(dest="bench_command", metavar="{load,serve}",
                                description="specd bench load: latency under load; specd bench serve: an "
                                            "OpenAI-compatible server under load (see --help)")
    bench_load.add_parser(commands)
    bench_serve.add_parser(commands)


def run(args: argparse.Namespace) -> int:
    from specd.bench import report
    from specd.bench.suite import run_suite

    if args.reps < 1:
        print("specd bench: error: --reps must be >= 1", file=sys.stderr)
        return 2
    max_tokens = args.max_tokens or (16 if args.quick else 48)
    target, draft = resolve_models(args, want_draft=args.target is None or args.draft is not None)
    log = lambda m: print(f"[specd bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    results, prompts, info = run_suite(target, draft, quick=args.quick, reps=args.reps, max_tokens=max_tokens,
                                       dtype=args.dtype, device=args.device, include_hf=not args.no_hf,
                                       log=log)
    rows = report.summarize(results)
    machine = report.machine()
    print(f"specd bench: {len(prompts)} prompts x {max_tokens} tokens, greedy, batch 1, median of {args.reps} "
          f"reps, dtype {args.dtype}, device {args.device}; {machine['cpu']} ({' '.join(machine['cpu_flags'])}), "
          f"{machine['threads']} threads" + (f"; GPU {machine['cuda']}" if args.device.startswith("cuda") else ""))
    print(report.table(rows))
    head = report.headline(rows)
    if head:
        print("headline:", ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in head.items()))
    mismatched = [r["config"] for r in rows if r["system"] == "specd" and r.get("identical_to_plain") is False]
    print("greedy outputs identical to specd plain decoding:", "yes" if not mismatched else f"NO: {mismatched}")
    if args.json:
        report.write_json(args.json, rows, info)
        print(f"wrote {args.json}")
    if args.plot:
        for path in report.write_plots(args.plot, rows):
            print(f"wrote {path}")
    return 1 if mismatched else 0
