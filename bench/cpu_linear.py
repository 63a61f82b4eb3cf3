"""The CPU products of the torch forward on the real pair: F.linear (MKL sgemm) against
oneDNN's inner product (models/cpu_linear.py), in one run, interleaved.

Prints two tables (docs/benchmarks.md, "oneDNN linears on the CPU"):
- forward ms of the target and of the draft at 1..N new tokens after a 64-token prefix (the
  verify passes of chains of k = 0..N-1 and the draft's catch-ups), median of --reps;
- greedy generation, plain decoding and the draft model at k = 4, tokens per second, median
  of --reps, each choice in turn within every repetition; it checks that speculative output
  equals plain output token for token under each choice.

Loads the default pair (specd.hub.default_pair). ``--quick`` (1 rep, fewer rows) is for
checking the script.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

CHOICES = ("torch", "onednn")


def forward_ms(model, rows: int, reps: int) -> float:
    """Median ms of a forward of ``rows`` new tokens after a 64-token prefix (a fresh pool per
    call: the timed forward alone)."""
    import torch

    from specd.engine.model_runner import Segment, forward
    from specd.kv_cache import KVCachePool, KVModel

    times = []
    ids = torch.arange(64 + rows) % 1000 + 100
    for _ in range(reps):
        pool = KVCachePool([KVModel("target", model.config, model.dtype)], 64, 16)
        pool.blocks.add_sequence(0)
        for start, n in ((0, 64), (64, rows)):
            slots = pool.blocks.reserve(0, n).slots
            seg = Segment(0, ids[start:start + n], torch.arange(start, start + n), slots, start + n, None, None,
                          logits_from=0)
            t0 = time.perf_counter()
            forward(model, pool, 0, [seg])
            elapsed = time.perf_counter() - t0
            pool.blocks.commit(0, n)
        times.append(elapsed * 1e3)  # the second forward's
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-rows", type=int, default=9, help="forward table: 1..N new tokens")
    ap.add_argument("--max-tokens", type=int, default=48, help="generation: tokens per run")
    ap.add_argument("--prompt", default="def quicksort(xs):")
    ap.add_argument("--dtype", default="float32", help="float32 (the choice's default scope), bfloat16 or auto")
    ap.add_argument("--quick", action="store_true", help="1 rep, 3 rows, 16 tokens")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.max_rows, args.max_tokens = 1, 3, 16
    import torch

    import specd
    from specd.hardware import cpu_model, resolve_dtype
    from specd.hub import default_pair

    dtype = resolve_dtype(args.dtype, "cpu")
    target, draft = default_pair(dtype, with_draft=True)
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=4),
                    dtype=dtype, device="cpu", max_num_seqs=1)
    print(f"{cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, {dtype}")

    def choose(choice):
        llm.target.cpu_linear = llm.draft.cpu_linear = choice

    print("forward ms after a 64-token prefix (median of", args.reps, "):")
    print(f"{'model':7s} {'rows':>4s} {'torch':>9s} {'onednn':>9s} {'x':>6s}")
    for name, model in (("target", llm.target), ("draft", llm.draft)):
        for rows in range(1, args.max_rows + 1):
            ms = {}
            for choice in CHOICES:
                choose(choice)
                ms[choice] = forward_ms(model, rows, args.reps)
            print(f"{name:7s} {rows:4d} {ms['torch']:9.1f} {ms['onednn']:9.1f} {ms['torch'] / ms['onednn']:6.2f}",
                  flush=True)

    params = specd.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    rates = {(c, p): [] for c in CHOICES for p in ("none", "draft")}
    for rep in range(args.reps + 1):
        for choice in CHOICES:
            choose(choice)
            outs = {}
            for policy in ("none", "draft"):
                llm.reset(policy="none" if policy == "none" else "static")
                t0 = time.perf_counter()
                outs[policy] = llm.generate([args.prompt], params)[0].token_ids
                if rep > 0:  # rep 0 warms up
                    rates[(choice, policy)].append(len(outs[policy]) / (time.perf_counter() - t0))
            if outs["draft"] != outs["none"]:
                print(f"speculative output differs from plain output with {choice} products", file=sys.stderr)
                return 1
    print(f"greedy generation, {args.max_tokens} tokens, tok/s (median of {args.reps}); "
          "speculative output equals plain output under each choice:")
    print(f"{'mode':22s} {'torch':>8s} {'onednn':>8s} {'x':>6s}")
    for policy, label in (("none", "plain decoding"), ("draft", "draft model, k = 4")):
        t, o = (statistics.median(rates[(c, policy)]) for c in CHOICES)
        print(f"{label:22s} {t:8.2f} {o:8.2f} {o / t:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
