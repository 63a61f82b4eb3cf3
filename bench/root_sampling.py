"""Sampled requests without drafts (k = 0: plain decoding, or the controller speculating
nothing): the engine's verification inputs for a batch of them, three ways.

    python bench/root_sampling.py [--device cpu|cuda] [--batches 1,16,64] [--vocab 151936]
                                  [--reps 9] [--json F]

- "verify root": the engine's default (KernelChoice.draw = "inverse_cdf"), as for
  requests with drafts: ``specd::sampling_probs`` writes each request's probability row, then
  ``specd::verify_stochastic`` draws the bonus token of its root-only tree from it.
- "sample_tokens": one ``specd::sample_tokens`` call (engine/batch_verify.py
  ``_sample_roots``), no probability rows; the same tokens (on the CPU always, checked; on a
  GPU the two kernels sum in other orders, so a draw within ~1e-15 of a CDF step may differ:
  counted and printed). Not an engine path: measured to decide whether it should be.
- "gumbel": the same call with the Gumbel-max draw, the engine's path under
  KernelChoice.draw = "gumbel": other tokens, the same distribution.

SYNTHETIC logits (N(0, 4), seeded), temperature 0.8 with no cut, then top-p 0.9. ms per call
of ``verify_inputs``-level work (the packing, the ops, the one copy back), the median of
--reps interleaved runs; ratios against "verify root" in the same run. On a GPU the times are
wall times of the whole call including its host sync (what an engine step waits for).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

from specd.engine.batch_verify import _sample_roots, _verify_sampled
from specd.engine.params import SamplingParams
from specd.verification import TokenTree


def requests(batch: int, params: SamplingParams):
    items = [SimpleNamespace(request=SimpleNamespace(id=r, params=params, length=100 + r, rng_seed=7 + r,
                                                      rng_request=r)) for r in range(batch)]
    trees = {r: TokenTree(0) for r in range(batch)}
    return [(it, (r, r + 1)) for r, it in enumerate(items)], trees


def timed(fn, dev: torch.device) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3  # every way ends with a copy to the host (a sync)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    cluster = dev.type == "cuda"
    rows = []
    print(f"{'params':<18} {'batch':>5} {'verify root ms':>15} {'sample_tokens ms':>17} {'x':>6} "
          f"{'gumbel ms':>10} {'x':>6}")
    for name, params in (("temperature 0.8", SamplingParams(temperature=0.8)),
                         ("top-p 0.9", SamplingParams(temperature=1.0, top_p=0.9))):
        for batch in (int(b) for b in args.batches.split(",")):
            g = torch.Generator().manual_seed(batch)
            logits = (torch.randn(batch, args.vocab, generator=g) * 4).to(dev)
            group, trees = requests(batch, params)
            ways = {
                "verify root": lambda: _verify_sampled(group, trees, logits, None, cluster),
                "sample_tokens": lambda: _sample_roots(group, logits, cluster, False),
                "gumbel": lambda: _sample_roots(group, logits, cluster, True),
            }
            old, new = ways["verify root"](), ways["sample_tokens"]()
            differ = sum(list(a.tokens) != list(b.tokens) for a, b in zip(old, new))
            for fn in ways.values():  # warm-up
                fn()
            times = {k: [] for k in ways}
            for _ in range(args.reps):
                for k, fn in ways.items():
                    times[k].append(timed(fn, dev))
            med = {k: statistics.median(v) for k, v in times.items()}
            x_new, x_gumbel = med["verify root"] / med["sample_tokens"], med["verify root"] / med["gumbel"]
            print(f"{name:<18} {batch:>5} {med['verify root']:>15.2f} {med['sample_tokens']:>17.2f} {x_new:>6.2f} "
                  f"{med['gumbel']:>10.2f} {x_gumbel:>6.2f}{f'  {differ} tokens differ' if differ else ''}",
                  flush=True)
            rows.append({"params": name, "batch": batch, "verify_root_ms": med["verify root"],
                         "sample_tokens_ms": med["sample_tokens"], "gumbel_ms": med["gumbel"],
                         "tokens_differing": differ})
            if differ and dev.type == "cpu":  # the CPU references share every operation: never
                print("sample_tokens and verification of the root gave other tokens", file=sys.stderr)
                return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(dev), "vocab": args.vocab, "reps": args.reps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
