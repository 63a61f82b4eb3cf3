"""A verify step's KV moves for token trees: the accepted paths' K/V moved next to each
request's history in every layer, per request with ``KVCachePool.copy_slots`` (two indexing
ops per layer, what the engine did until 2026-11-28) against one ``KVCachePool.compact`` per
model for the whole step (one ``kv_compact`` over every request and layer, what it does now).

    python bench/kv_compact_step.py [--device cpu|cuda] [--batches 1,8,32] [--reps 15]
                                    [--dtype float32|bfloat16] [--json F]

SYNTHETIC paths: each request has a tree of 9 nodes in lookahead slots past a random history
and accepts a random root-to-node path of 1-4 nodes that is not a prefix of its node order
(so it has to move). The pool is shaped like the default pair's: target 28 layers x 2 KV
heads x 128 with 16-token pages; draft 24 layers x 2 x 64 (its own block size). Both models
move each step, as for draft-model trees. Times are wall clock per step, synchronised on a
GPU, median of --reps; both ways run interleaved, from the same pool contents, and their
results are compared (the same bytes).
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

from specd.kv_cache import KVCachePool, KVModel
from specd.models.config import ModelConfig

TREE = 9


def config(layers: int, head_dim: int) -> ModelConfig:
    return ModelConfig(architecture="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                       num_hidden_layers=layers, num_attention_heads=12, num_key_value_heads=2, head_dim=head_dim,
                       rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=True,
                       attention_bias=True)


def make_step(batch: int, device: str, dtype: torch.dtype, seed: int):
    """A pool with ``batch`` requests' trees reserved, and per model the (sequence, tree start,
    path) rows a step moves."""
    rng = np.random.default_rng(seed)
    pool = KVCachePool([KVModel("target", config(28, 128), dtype), KVModel("draft", config(24, 64), dtype)],
                       num_pages=batch * 12 + 8, target_block_size=16, device=device)
    pool.storage.copy_(torch.from_numpy(rng.integers(0, 256, pool.storage.numel(), dtype=np.uint8)).to(device))
    moves = {0: [], 1: []}
    for seq in range(batch):
        pool.blocks.add_sequence(seq)
        for model in (0, 1):
            history = int(rng.integers(1, 120))
            pool.blocks.reserve(seq, history, model=model)
            pool.blocks.commit(seq, history, model=model)
            pool.blocks.reserve(seq, TREE, model=model)
            depth = int(rng.integers(1, 5))
            nodes = np.sort(rng.choice(np.arange(2, TREE), depth, replace=False))  # never 1..depth
            moves[model].append((seq, history, np.concatenate([[0], nodes]).astype(np.int32)))
    return pool, moves


def per_request(pool: KVCachePool, moves) -> None:
    for model, rows in moves.items():
        for seq, start, path in rows:
            slots = pool.blocks.slots(seq, start, start + TREE, model=model)
            pool.copy_slots(model, torch.from_numpy(slots[path[1:]]), torch.from_numpy(slots[1:len(path)]))


def one_call(pool: KVCachePool, moves) -> None:
    for model, rows in moves.items():
        pool.compact(model, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])


def timed(fn, pool, moves, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(pool, moves)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--dtype", default=None, help="float32 (default on the CPU) or bfloat16 (default on CUDA)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype or ("float32" if args.device == "cpu" else "bfloat16"))
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        pool, moves = make_step(batch, args.device, dtype, seed=batch)
        start = pool.storage.clone()
        results, times = {}, {"per_request": [], "one_call": []}
        for _ in range(args.reps + 1):  # the first round warms up
            for name, fn in (("per_request", per_request), ("one_call", one_call)):
                pool.storage.copy_(start)
                times[name].append(timed(fn, pool, moves, args.device))
                results[name] = pool.storage.clone()
        same = torch.equal(results["per_request"], results["one_call"])
        per, one = (1e6 * statistics.median(times[k][1:]) for k in ("per_request", "one_call"))
        rows.append({"batch": batch, "per_request_us": per, "one_call_us": one, "speedup": per / one,
                     "same_bytes": same})
    print(f"SYNTHETIC tree paths, both models moved per step, {args.device} {str(dtype).split('.')[-1]}, "
          f"median of {args.reps}: wall us per step")
    print(f"{'batch':>5} {'per request':>12} {'one call':>9} {'x':>6}  same bytes")
    for r in rows:
        print(f"{r['batch']:5d} {r['per_request_us']:12.1f} {r['one_call_us']:9.1f} {r['speedup']:6.1f}  "
              f"{r['same_bytes']}")
    if args.json:
        args.json.write_text(json.dumps({"synthetic": "tree paths", "device": args.device, "rows": rows}, indent=1)
                             + "\n")
    return 0 if all(r["same_bytes"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
