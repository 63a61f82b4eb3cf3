"""Draft time per step of draft-model trees on the real pair (CPU): the engine's own draft
forward seconds (EngineTimings.draft_forward_s) and the draft tokens it fed, per verify step,
over one greedy code prompt, median of --reps runs after a warm-up run in one process.

    python bench/draft_tree_cpu.py --width 3 --reps 3

Compares code versions when run once per version (docs/benchmarks.md, "Draft-model trees:
frontier feeding and kept draft KV"). Loads the default pair (specd.hub.default_pair).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=3, help="draft_tree_width (1: chains)")
    ap.add_argument("-k", type=int, default=4, help="draft depth")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--prompt", default="def quicksort(xs):")
    ap.add_argument("--dtype", default="float32", help="the models' dtype (LLM's dtype: float32, bfloat16, auto)")
    ap.add_argument("--cpu-linear", default=None, choices=["onednn", "torch"],
                    help="the models' CPU products (LlamaModel.cpu_linear; default: their default)")
    args = ap.parse_args(argv)
    import specd
    from specd.hardware import resolve_dtype
    from specd.hub import default_pair

    target, draft = default_pair(resolve_dtype("auto", "cpu"), with_draft=True)
    spec = specd.SpeculationConfig(method="draft", num_speculative_tokens=args.k, draft_tree_width=args.width)
    llm = specd.LLM(target, draft, spec, dtype=args.dtype, device="cpu", max_num_seqs=1)
    llm.target.cpu_linear = llm.draft.cpu_linear = args.cpu_linear
    params = specd.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    engine, fed = llm.engine, [0]
    real_forward = engine.timer.forward

    def counted(which, tokens, fn, keys=None):  # the draft tokens each forward feeds
        if which == "draft":
            fed[0] += tokens
        return real_forward(which, tokens, fn, keys)

    engine.timer.forward = counted
    ms, tokens, rates = [], [], []
    for rep in range(args.reps + 1):
        engine.timings.reset()
        fed[0] = 0
        t0 = time.perf_counter()
        out = llm.generate([args.prompt], params)[0]
        wall = time.perf_counter() - t0
        t = engine.timings
        if rep == 0:
            continue  # warm-up
        ms.append(t.draft_forward_s / t.steps * 1e3)
        tokens.append(fed[0] / t.steps)
        rates.append(len(out.token_ids) / wall)
    print(f"{llm.draft.dtype}, products {llm.draft.linear_fn().__name__}; width {args.width}, k {args.k}: draft ms/step median {statistics.median(ms):.1f} "
          f"({', '.join(f'{x:.0f}' for x in ms)}); draft tokens fed/step {statistics.median(tokens):.1f}; "
          f"tok/s median {statistics.median(rates):.2f}; verify steps {t.steps}; "
          f"accepted {out.metrics.accepted_tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
