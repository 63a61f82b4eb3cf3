"""What constraining the drafts by the grammar buys under structured outputs
(engine/grammar_drafts.py: forced tokens drafted, n-gram/suffix trees pruned, draft-model rows
masked), in one run: each speculative method with its drafts "constrained" (all of it),
"unforced" (``Engine.forced_drafts = False``: no forced tokens) and "free"
(``Engine.constrain_drafts = False``), next to plain decoding ("none" with its drafts "free")
and jump-forward decoding ("none" with its drafts "constrained": no proposer, the grammar's
forced tokens verified as drafts, SpeculationConfig.jump_forward_tokens).

    python bench/structured_outputs_drafts.py [--target PATH|default [--draft PATH]]
                                              [--hidden 512] [--layers 8]
                                              [--methods ngram,suffix,draft] [--k 4]
                                              [--max-tokens 64] [--reps 3] [--device cpu]
                                              [--dtype float32] [--json PATH]

Tasks (greedy; chat-formatted with the tokenizer's template when it has one): extract a JSON
object following a schema from a short text, write a date and time matching a regex,
classify a review as one of a choice of labels. The requests of a task run as one batch.

``--target default`` takes the default real pair (Qwen2.5-Coder 1.5B / 0.5B, cached by
``specd bench``; specd.hub.default_pair). Without --target the models are SYNTHETIC
(bench_models.py: a random Llama, 8 layers of width 512, and a 1-layer draft cut from it);
their outputs follow the grammar but mean nothing.

Per task, method and setting: median over --reps of the seconds per task, the drafts
verified, their acceptance and the tokens per target step, and the time relative to plain
decoding and to the same method with free drafts. Each run starts from a fresh engine
(``LLM.reset``: no prefix or suffix cache carried over). Every output is checked equal to
plain decoding's token for token (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench_models import add_model_args, models_for

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "city": {"type": "string"}, "languages": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "city", "languages"], "additionalProperties": False}
PEOPLE = [
    "Maria Lopez is 34, lives in Valencia and writes Python, Rust and a little Go.",
    "Kenji Watanabe (52) moved to Osaka last year; he codes in C++ and Fortran.",
    "At 27, Amara Okafor is a Lagos-based developer who uses TypeScript and Kotlin.",
]
EVENTS = [
    "The release meeting is on the third of March 2025 at half past two in the afternoon.",
    "We land on 14 November 2024 at 07:05 in the morning.",
    "Deadline: June 30th, 2025, five minutes before midnight.",
]
REVIEWS = [
    "The build broke twice and support never answered. Never again.",
    "Does what it says, nothing more. Fine for the price.",
    "Fast, well documented and the API is a joy. Highly recommended!",
]
LABELS = ["positive", "neutral", "negative"]


def tasks(so_cls) -> dict:
    return {
        "json schema": (so_cls(json=SCHEMA),
                        [f"Extract name, age, city and programming languages as JSON: {p}" for p in PEOPLE]),
        "regex": (so_cls(regex=r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}"),
                  [f"Write the date and time as YYYY-MM-DD HH:MM (24-hour clock): {e}" for e in EVENTS]),
        "choice": (so_cls(choice=LABELS),
                   [f"Classify the sentiment of this review as positive, neutral or negative: {r}" for r in REVIEWS]),
    }


def _chat(tokenizer, text: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text + "\n"


SETTINGS = ("constrained", "unforced", "free")  # all on; no forced tokens; all off


def run(llm, prompts, params, setting) -> dict:
    llm.reset()
    llm.engine.constrain_drafts = setting != "free"
    llm.engine.forced_drafts = setting == "constrained"
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - t0
    m = [o.metrics for o in outs]
    return {"seconds": seconds, "outputs": [o.token_ids for o in outs], "texts": [o.text for o in outs],
            "drafted": sum(x.draft_tokens for x in m), "accepted": sum(x.accepted_tokens for x in m),
            "steps": sum(x.verify_steps for x in m), "generated": sum(x.generated_tokens for x in m)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--methods", default="ngram,suffix,draft", help="comma-separated: ngram, suffix, draft")
    p.add_argument("--k", type=int, default=4, help="drafts per step (static)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--jump-forward-tokens", type=int, default=8,
                   help="the longest forced chain of jump-forward decoding (SpeculationConfig; default 8)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    models = models_for(args, "structured_outputs_drafts.py")
    if models is None:
        return 2
    tmp, target, draft, synthetic, methods = models
    import specd

    def spec(method: str):
        return specd.SpeculationConfig(method=method, num_speculative_tokens=args.k if method != "none" else 0,
                                       jump_forward_tokens=args.jump_forward_tokens)

    first = "draft" if "draft" in methods else "none"  # the one LLM that loads the weights
    base = specd.LLM(target, draft if first == "draft" else None, spec(first), dtype=args.dtype, device=args.device)
    llms = {first: base}
    for method in ["none"] + methods:
        if method not in llms:  # the same weights
            llms[method] = specd.LLM.from_models(base.target, base.draft if method == "draft" else None, spec(method),
                                                 tokenizer=base.tokenizer, device=args.device)
    # plain decoding ("none", "free": jump-forward off with the constrained drafts), jump-forward
    cases = [("none", "free"), ("none", "constrained")] + [(m, setting) for m in methods for setting in SETTINGS]
    work = {name: (so, [_chat(base.tokenizer, t) for t in texts])
            for name, (so, texts) in tasks(specd.StructuredOutputsParams).items()}
    for llm in llms.values():  # untimed warm-up
        llm.generate(["warm up"], specd.SamplingParams(max_tokens=4))
    runs: dict = {}
    for _ in range(args.reps):  # interleaved: every case once per rep
        for name, (so, prompts) in work.items():
            params = specd.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, structured_outputs=so)
            for method, setting in cases:
                runs.setdefault((name, method, setting), []).append(run(llms[method], prompts, params, setting))

    what = "SYNTHETIC random models" if synthetic else f"{Path(target).name} / {Path(draft).name if draft else '-'}"
    print(f"structured outputs, constrained vs free drafts: {what}; device {args.device}, {args.dtype}; "
          f"k = {args.k}, up to {args.max_tokens} tokens, {len(PEOPLE)} requests per task as one batch; "
          f"median of {args.reps} reps")
    print(f"{'task':12} {'method':7} {'drafts':12} {'s':>7} {'verified':>9} {'accept':>7} {'tok/step':>9} "
          f"{'vs plain':>9} {'vs free':>10}")
    rows, same = [], True
    for name in work:
        plain = runs[(name, "none", "free")]
        plain_s = statistics.median(r["seconds"] for r in plain)
        for method, setting in cases:
            rs = runs[(name, method, setting)]
            seconds = statistics.median(r["seconds"] for r in rs)
            off = runs.get((name, method, "free"))
            off_s = statistics.median(r["seconds"] for r in off) if off else None
            equal = all(r["outputs"] == plain[0]["outputs"] for r in rs)
            same &= equal
            r0 = rs[0]
            row = {"task": name, "method": method, "drafts": setting, "seconds": seconds,
                   "drafted": r0["drafted"], "accepted": r0["accepted"],
                   "acceptance": r0["accepted"] / r0["drafted"] if r0["drafted"] else None,
                   "tokens_per_step": r0["generated"] / r0["steps"] if r0["steps"] else None,
                   "vs_plain": seconds / plain_s, "vs_free": seconds / off_s if off_s else None,
                   "same_output": equal, "texts": r0["texts"]}
            rows.append(row)
            drafts = setting
            acc = f"{row['acceptance']:.2f}" if row["acceptance"] is not None else "-"
            tps = f"{row['tokens_per_step']:.2f}" if row["tokens_per_step"] is not None else "-"
            vs = f"{row['vs_free']:.2f}x" if row['vs_free'] is not None else "-"
            print(f"{name:12} {method:7} {drafts:12} {seconds:7.2f} {row['drafted']:9d} {acc:>7} {tps:>9} "
                  f"{row['vs_plain']:8.2f}x {vs:>10}")
    print("outputs equal plain decoding's: " + ("yes" if same else "NO"))
    for name in work:
        print(f"  {name}: {runs[(name, 'none', 'free')][0]['texts']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"synthetic": synthetic, "args": vars(args), "rows": rows}, indent=1))
    tmp.cleanup()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
