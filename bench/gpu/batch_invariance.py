"""Does a row's result depend on the rows computed beside it? The target's products, row by row.

Plain decoding runs the target on 1 row per request and step; verification runs it on 1 + k rows
per request. If a product's rounding depends on how many rows it computes at once (a GEMM
library picks its kernel and its split of the reduction by shape), the same position gets logits
that differ in the last bits between the two. At a near tie the greedy argmax then differs, and
greedy speculative output differs from plain decoding's although no rule is broken. The seventh
GPU session saw such a difference on an H200 in bfloat16 (docs/benchmarks.md).

For each product of the target's shapes (the real pair's 1.5B target: fused q/k/v, o, fused
gate/up, down, LM head), this computes ``F.linear`` on M rows for several M, and compares row 0
of each result with row 0 computed alone (M = 1), bit for bit. Then the same for specd's
attention kernels (per-head and grouped): one request's first query computed alone and among 8
requests of 1, 5 or 9 queries each (a kernel whose launch shape follows the grid may sum in
another order). It prints one line per operation with the shapes whose row 0 differs and the
largest difference, and writes JSON with ``--json``.

Usage (the GPU machine): ``python bench/gpu/batch_invariance.py [--json FILE]``; bfloat16 on
CUDA. ``--smoke-cpu``: tiny float32 shapes on the CPU (checks the script).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

import torch
import torch.nn.functional as F

# name: (in features, out features) of the real pair's target (hidden 1536, 12 + 2 + 2 heads
# of 128, intermediate 8960, vocabulary 151,936).
PRODUCTS = {"qkv": (1536, 2048), "o": (1536, 1536), "gate_up": (1536, 17920), "down": (8960, 1536),
            "lm_head": (1536, 151_936)}
SMOKE_PRODUCTS = {"qkv": (64, 128), "lm_head": (64, 1000)}
# 1 row: plain decoding at batch 1; 5: k = 4 at batch 1; 8 and 40: batch 8 plain and k = 4;
# 64 and 320: batch 64.
ROWS = (1, 2, 5, 8, 9, 16, 40, 64, 320)


def compare(in_f: int, out_f: int, rows: tuple[int, ...], dev: str, dtype: torch.dtype, seed: int = 0) -> dict:
    """Row 0 of F.linear over the first M rows of one input, for every M in ``rows``, against
    M = 1: {M: max |difference|} (0.0 where bit-equal)."""
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(max(rows), in_f, generator=g, device=dev).to(dtype)
    w = (0.02 * torch.randn(out_f, in_f, generator=g, device=dev)).to(dtype)
    alone = F.linear(x[:1], w)[0].float()
    out = {}
    for m in rows:
        row0 = F.linear(x[:m], w)[0].float()
        out[m] = 0.0 if torch.equal(row0, alone) else float((row0 - alone).abs().max())
    return out


def attention_row0(batch: int, queries: int, history: int, dev: str, dtype: torch.dtype, grouped: bool,
                   heads: tuple[int, int, int], seed: int = 0) -> torch.Tensor:
    """specd::tree_attention's output for request 0's first query (position ``history``, causal:
    keys 0..history) when ``batch`` requests of ``queries`` queries each are computed together.
    The caches, tables and request 0's first query are the same for every (batch, queries), so
    a batch-invariant kernel gives the same bits for all of them."""
    import specd.ops as ops

    q_heads, kv_heads, head_dim = heads
    bs, most_batch, most_queries = 16, 8, 9
    width = -(-(history + most_queries) // bs)
    g = torch.Generator(device=dev).manual_seed(seed)
    pages = most_batch * width
    k_cache = torch.randn(pages, bs, kv_heads, head_dim, generator=g, device=dev).to(dtype)
    v_cache = torch.randn(pages, bs, kv_heads, head_dim, generator=g, device=dev).to(dtype)
    table = torch.arange(pages, device=dev, dtype=torch.int32).view(most_batch, width)[:batch].contiguous()
    q_all = torch.randn(most_batch, most_queries, q_heads, head_dim, generator=g, device=dev).to(dtype)
    q = q_all[:batch, :queries].reshape(batch * queries, q_heads, head_dim).contiguous()
    starts = torch.arange(0, batch * queries + 1, queries, device=dev, dtype=torch.int32)
    kv_lens = torch.full((batch,), history + queries, device=dev, dtype=torch.int32)
    return ops.tree_attention(q, k_cache, v_cache, table, starts, kv_lens, grouped=grouped)[0].float()


ATTENTION_SHAPES = ((1, 1), (1, 5), (8, 1), (8, 5), (8, 9))  # (requests, queries per request)


def compare_attention(dev: str, dtype: torch.dtype, grouped: bool, history: int,
                      heads: tuple[int, int, int]) -> dict:
    """{(requests, queries): max |difference|} of request 0's first query against (1, 1)."""
    alone = attention_row0(1, 1, history, dev, dtype, grouped, heads)
    out = {}
    for b, q in ATTENTION_SHAPES:
        row0 = attention_row0(b, q, history, dev, dtype, grouped, heads)
        out[f"{b}x{q}"] = 0.0 if torch.equal(row0, alone) else float((row0 - alone).abs().max())
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke-cpu", action="store_true", help="tiny float32 shapes on the CPU")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.smoke_cpu:
        dev, dtype, products = "cpu", torch.float32, SMOKE_PRODUCTS
    elif torch.cuda.is_available():
        dev, dtype, products = "cuda", torch.bfloat16, PRODUCTS
    else:
        print("needs a CUDA device (or --smoke-cpu)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"batch invariance of F.linear on {name}, {str(dtype).replace('torch.', '')}: row 0 of M rows "
          f"against row 0 alone, M in {list(ROWS)}")
    results = {}
    for product, (in_f, out_f) in products.items():
        diffs = compare(in_f, out_f, ROWS, dev, dtype)
        results[product] = {"in": in_f, "out": out_f, "max_abs_diff_by_rows": diffs}
        differ = [m for m, d in diffs.items() if d != 0.0]
        print(f"  {product:<8} {in_f:>6} -> {out_f:<7} "
              + (f"row 0 differs at M = {differ} (largest |diff| {max(diffs.values()):.3g})" if differ
                 else "row 0 bit-equal at every M"))
    # The attention kernel: request 0's first query among more requests and more queries each
    # (plain decoding: 1 query per request; verification: 1 + k). CPU: the float32 reference.
    heads, history = ((4, 2, 16), 40) if args.smoke_cpu else ((12, 2, 128), 256)
    attention = {}
    for grouped in ((False,) if dev == "cpu" else (False, True)):
        name = "tree_attention" + (" grouped" if grouped else "")
        diffs = compare_attention(dev, dtype, grouped, history, heads)
        attention[name] = diffs
        differ = [shape for shape, d in diffs.items() if d != 0.0]
        print(f"  {name:<23} history {history}: "
              + (f"request 0's first row differs at (requests x queries) {differ} (largest |diff| "
                 f"{max(diffs.values()):.3g})" if differ else "request 0's first row bit-equal at every shape"))
    invariant = all(d == 0.0 for r in results.values() for d in r["max_abs_diff_by_rows"].values())
    invariant = invariant and all(d == 0.0 for r in attention.values() for d in r.values())
    print("every product and the attention batch-invariant: " + ("yes" if invariant else "no: verify and plain "
          "decoding round differently, so near ties can decide differently"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "dtype": str(dtype), "rows": list(ROWS), "products": results,
                       "attention": attention, "invariant": invariant}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
