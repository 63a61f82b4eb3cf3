"""What the logits processors cost a verify step (engine/logits_processors.py): penalised
requests' rows processed the CPU's way (only the columns a penalty can change) and the GPU's
way (every column), on this machine's device.

    python bench/logits_processors_cost.py [--batches 1,16,64] [--vocab 151936] [--k 4]
                                           [--prompt 500] [--output 1000] [--reps 5] [--device cpu]

SYNTHETIC requests: prompts and outputs of random ids below 5,000, a chain of k random drafts
each, repetition 1.05, presence 0.5 and frequency 0.2 penalties; float32 logits
``[batch x (k + 1), vocab]``. Each rep first appends 3 tokens to every output (a step's
emitted tokens), then times ``LogitsProcessors.apply`` (the state's update included; on a GPU
synchronised before and after). Median ms per step; both ways' rows are checked equal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch


def measure(batch: int, vocab: int, k: int, prompt: int, output: int, reps: int, device: torch.device) -> dict:
    import specd
    from specd.engine.logits_processors import LogitsProcessors
    from specd.engine.request import Request

    rng = np.random.default_rng(0)
    params = specd.SamplingParams(max_tokens=100_000, repetition_penalty=1.05, presence_penalty=0.5,
                                  frequency_penalty=0.2)
    reqs = [Request(i, None, rng.integers(0, 5000, prompt).tolist(), params, 0, i, 1_000_000, frozenset({0}),
                    output_ids=rng.integers(0, 5000, output).tolist()) for i in range(batch)]
    trees = [specd.TokenTree.chain(1, rng.integers(0, 5000, k).tolist()) for _ in range(batch)]
    starts = [(k + 1) * i for i in range(batch)]
    raw = torch.randn(batch * (k + 1), vocab, device=device)
    out, results = {}, {}
    for name, all_columns in (("changeable columns", False), ("all columns", True)):
        lp = LogitsProcessors(all_columns)
        lp.apply(raw.clone(), reqs, trees, starts)  # the prompts and histories go up once
        times = []
        for _ in range(reps):
            for r in reqs:
                r.output_ids.extend(rng.integers(0, 5000, 3).tolist())
            logits = raw.clone()
            _sync(device)
            t0 = time.perf_counter()
            lp.apply(logits, reqs, trees, starts)
            _sync(device)
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times) * 1e3
    for name, all_columns in (("changeable columns", False), ("all columns", True)):  # the same requests
        results[name] = raw.clone()
        LogitsProcessors(all_columns).apply(results[name], reqs, trees, starts)
    same = torch.allclose(results["changeable columns"], results["all columns"], rtol=1e-6, atol=1e-6)
    return {"batch": batch, "ms_changeable_columns": out["changeable columns"], "ms_all_columns": out["all columns"],
            "same_rows": bool(same)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompt", type=int, default=500)
    p.add_argument("--output", type=int, default=1000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    rows = [measure(int(b), args.vocab, args.k, args.prompt, args.output, args.reps, device)
            for b in args.batches.split(",")]
    print(f"SYNTHETIC penalised requests on {device}: vocab {args.vocab}, k {args.k}, prompts {args.prompt}, "
          f"outputs {args.output} tokens; median ms per step of {args.reps}")
    print(f"{'batch':>5} {'changeable columns':>19} {'all columns':>12} same rows")
    for r in rows:
        print(f"{r['batch']:>5} {r['ms_changeable_columns']:>19.2f} {r['ms_all_columns']:>12.2f} "
              f"{'yes' if r['same_rows'] else 'NO'}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, **vars(args), "json": None}, indent=1))
    return 0 if all(r["same_rows"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
