"""What automatic prefix caching saves, and what it costs when nothing is shared: the same
requests through an LLM with the cache and one without, in one run, cases interleaved.

    python bench/prefix_cache.py [--target PATH|default [--draft PATH]] [--methods none,draft]
                                 [--system 1024] [--question 32] [--requests 8] [--turns 6]
                                 [--max-tokens 16] [--reps 3] [--device cpu] [--dtype float32]
                                 [--hidden 512] [--layers 8] [--json PATH]

Workloads (SYNTHETIC token ids, random below 384; greedy, EOS ignored):
- shared system prompt: --requests requests one after another, each a --system-token prompt
  shared by all, then its own --question tokens;
- chat: one conversation of --turns turns; each turn's prompt is the previous prompt, its
  answer and a new --question-token message;
- nothing shared: --requests distinct prompts of --system + --question tokens, submitted
  at once (the cache's cost without a hit: registering blocks, looking up in vain).

Without --target the models are SYNTHETIC too (bench_models.py): a random Llama of --layers 8
layers, --hidden 512 (about 32M parameters, so prefill costs what it does) built in a
temporary directory, and with method draft a 1-layer draft cut from it; ``--target default``
takes the real pair. Per workload, method and cache setting: median
over --reps of the time to first token (TTFT) and the latency per request, the whole
workload's seconds, the target tokens prefilled and the cache's hit rate; the ratio of the
cached run's time to the uncached one's. Each rep starts with an empty cache. Outputs with
and without the cache are checked equal token for token (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench_models import add_model_args, models_for

VOCAB_IDS = 384  # token ids drawn below this (the synthetic tokenizer's vocabulary)


def _workloads(args, rng) -> dict[str, list[list[int]]]:
    system = rng.integers(1, VOCAB_IDS, args.system).tolist()
    return {
        "shared system prompt": [system + rng.integers(1, VOCAB_IDS, args.question).tolist()
                                 for _ in range(args.requests)],
        "chat": [rng.integers(1, VOCAB_IDS, args.question).tolist() for _ in range(args.turns)],  # the messages
        "nothing shared": [rng.integers(1, VOCAB_IDS, args.system + args.question).tolist()
                           for _ in range(args.requests)],
    }


def _one(llm, prompt: list[int], params) -> tuple[float, float, list[int], int]:
    """One request alone: (TTFT s, latency s, tokens, cached tokens)."""
    t0 = time.perf_counter()
    rid = llm.add_request(prompt, params)
    first, tokens = None, []
    while True:
        for chunk in llm.step():
            if chunk.request_id != rid:
                continue
            if first is None and chunk.token_ids:
                first = time.perf_counter() - t0
            tokens += chunk.token_ids
            if chunk.finished:
                return first, time.perf_counter() - t0, tokens, chunk.metrics.cached_tokens


def run_workload(llm, name: str, prompts: list[list[int]], params) -> dict:
    llm.reset_prefix_cache()
    t0 = time.perf_counter()
    ttft, latency, outputs, cached = [], [], [], 0
    if name == "nothing shared":  # all at once
        outs = llm.generate(prompts, params)
        outputs = [o.token_ids for o in outs]
        cached = sum(o.num_cached_tokens for o in outs)
        prompt_tokens = sum(len(p) for p in prompts)
    else:
        history: list[int] = []
        prompt_tokens = 0
        for p in prompts:
            prompt = history + p if name == "chat" else p
            first, lat, tokens, hit = _one(llm, prompt, params)
            ttft.append(first)
            latency.append(lat)
            outputs.append(tokens)
            cached += hit
            prompt_tokens += len(prompt)
            history = prompt + tokens
    return {"seconds": time.perf_counter() - t0, "ttft": ttft, "latency": latency, "outputs": outputs,
            "cached_tokens": cached, "prompt_tokens": prompt_tokens}


def _ms(value, width: int) -> str:
    return f"{value:{width}.1f}" if value is not None else "-".rjust(width)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--methods", default="none,draft", help="comma-separated: none, draft, ngram, suffix")
    p.add_argument("--system", type=int, default=1024, help="tokens of the shared system prompt")
    p.add_argument("--question", type=int, default=32, help="tokens of each question / chat message")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    models = models_for(args, "prefix_cache.py")
    if models is None:
        return 2
    tmp, target, draft, synthetic, methods = models
    import specd

    params = specd.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    need = args.system + args.question + args.turns * (args.question + args.max_tokens) + 64
    llms = {}
    for method in methods:
        spec = specd.SpeculationConfig(method=method, num_speculative_tokens=3)
        for cache in (True, False):
            llm = specd.LLM(target, draft if method == "draft" else None, spec, dtype=args.dtype, device=args.device,
                            max_num_seqs=max(args.requests, 1), max_model_len=need, enable_prefix_caching=cache,
                            kv_cache_memory=1 << 30)
            llm.generate([[5, 6, 7]], specd.SamplingParams(max_tokens=4))  # untimed warm-up
            llms[(method, cache)] = llm
    workloads = _workloads(args, np.random.default_rng(0))
    runs: dict = {}
    for _ in range(args.reps):  # interleaved: every case once per rep
        for name, prompts in workloads.items():
            for key, llm in llms.items():
                runs.setdefault((name, *key), []).append(run_workload(llm, name, prompts, params))

    what = "SYNTHETIC random models and token ids" if synthetic else f"{Path(target).name} on synthetic token ids"
    print(f"prefix caching, {what}; device {args.device}, {args.dtype}; system prompt {args.system} tokens, "
          f"questions {args.question}, {args.max_tokens} tokens per answer; median of {args.reps} reps")
    header = f"{'workload':22} {'method':6} {'cache':5} {'TTFT ms':>9} {'latency ms':>11} {'total s':>8} " \
             f"{'cached/prompt tokens':>21} {'time vs off':>11}"
    print(header)
    rows, same = [], True
    for name in workloads:
        for method in methods:
            off = statistics.median(r["seconds"] for r in runs[(name, method, False)])
            for cache in (True, False):
                rs = runs[(name, method, cache)]
                seconds = statistics.median(r["seconds"] for r in rs)
                ttft = statistics.median(x for r in rs for x in r["ttft"]) * 1e3 if rs[0]["ttft"] else None
                lat = statistics.median(x for r in rs for x in r["latency"]) * 1e3 if rs[0]["latency"] else None
                equal = all(r["outputs"] == o["outputs"] for r, o in zip(rs, runs[(name, method, False)]))
                same &= equal
                row = {"workload": name, "method": method, "cache": cache, "ttft_ms": ttft, "latency_ms": lat,
                       "seconds": seconds, "cached_tokens": rs[0]["cached_tokens"],
                       "prompt_tokens": rs[0]["prompt_tokens"], "time_vs_off": seconds / off, "same_output": equal}
                rows.append(row)
                print(f"{name:22} {method:6} {'on' if cache else 'off':5} {_ms(ttft, 9)} {_ms(lat, 11)} "
                      f"{seconds:8.2f} {row['cached_tokens']:>10}/{row['prompt_tokens']:<10} "
                      f"{row['time_vs_off']:10.2f}x")
    print("outputs with and without the cache: " + ("identical" if same else "DIFFERENT"))
    if args.json:
        Path(args.json).write_text(json.dumps({"synthetic": synthetic, "args": vars(args), "rows": rows}, indent=1))
    tmp.cleanup()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
