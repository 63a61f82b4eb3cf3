"""Where a captured forward's GPU time goes, kernel by kernel, for the pair-shaped models on the
lent GPU (fused layers, KernelAttention): the draft's decode step and the target's verify step.

    python bench/gpu/kernel_breakdown.py [--out DIR] [--context N] [--dry-run]

Each case (model, batch, query) captures one forward in a CUDA graph (bench/gpu/profile_forwards
.py's forward_ms setup), replays it 10 times under torch.profiler, and groups the device
kernels by name: calls per forward, microseconds per call and per forward, share of the
forward's kernel time. Printed as tables (top 12 kernels per case) and written to
kernel_breakdown.json. Random weights: only the times mean anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_draft_loop import configs, random_model  # noqa: E402
from profile_forwards import captured_forward  # noqa: E402

CASES = (("draft", 1, 1), ("draft", 8, 1), ("target", 1, 5), ("target", 8, 5))
REPLAYS = 10


def breakdown(model, batch: int, query: int, context: int) -> list[dict]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    graph, keep = captured_forward(model, batch, query, context, "all")
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
    per_name = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start:
            entry = per_name[e.name]
            entry[0] += 1
            entry[1] += e.time_range.end - e.time_range.start
    total = sum(us for _, us in per_name.values()) / REPLAYS
    rows = [{"kernel": name, "calls_per_forward": n / REPLAYS, "us_per_call": us / n, "us_per_forward": us / REPLAYS,
             "share": us / REPLAYS / total if total else 0.0} for name, (n, us) in per_name.items()]
    del graph, keep
    torch.cuda.empty_cache()
    return sorted(rows, key=lambda r: -r["us_per_forward"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench-results")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    print(f"plan: {CASES} (model, batch, query) at context {args.context}; {REPLAYS} profiled replays each", flush=True)
    if args.dry_run:
        return 0
    import specd.ops as ops

    if not torch.cuda.is_available() or not ops.HAS_CUDA_KERNELS:
        print("needs a CUDA device and a specd build with CUDA kernels", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    target_cfg, draft_cfg = configs()
    models = {"target": random_model(target_cfg, "cuda", torch.bfloat16),
              "draft": random_model(draft_cfg, "cuda", torch.bfloat16)}
    result = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "context": args.context,
                       "layers": "fused", "replays": REPLAYS}, "cases": []}
    with torch.inference_mode():
        for name, batch, query in CASES:
            rows = breakdown(models[name], batch, query, args.context)
            total = sum(r["us_per_forward"] for r in rows)
            kernels = sum(r["calls_per_forward"] for r in rows)
            print(f"\n{name} batch {batch} x query {query}: {total:.0f} us of kernels per forward, {kernels:.0f} "
                  f"kernels", flush=True)
            print(f"  {'share':>6} {'us/fwd':>8} {'calls':>6} {'us/call':>8}  kernel")
            for r in rows[:12]:
                print(f"  {100 * r['share']:>5.1f}% {r['us_per_forward']:>8.1f} {r['calls_per_forward']:>6.0f} "
                      f"{r['us_per_call']:>8.2f}  {r['kernel'][:110]}")
            result["cases"].append({"model": name, "batch": batch, "query": query, "us_per_forward": total,
                                    "kernels_per_forward": kernels, "kernels": rows})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernel_breakdown.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
