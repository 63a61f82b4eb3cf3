"""Host (Python) time of one draft call through the draft graph runner, with the device work
left out: what the runner adds on the host per draft step, on any machine, no GPU needed.

    python bench/draft_call_host.py [--batches 1,8] [--temperatures 0,0.8] [--k 4] [--reps 30]
                                    [--tree-width W] [--profile N] [--json PATH]

Models: tiny random float32 Llama models built in a temporary directory (target 2 layers,
draft 1; the host work does not depend on their size). The engine generates a few tokens with
``draft_graph=True`` on the CPU; at its second draft call the call is repeated ``--reps`` times
(median reported) with the runner's device work replaced by nothing (``_body``: the forwards
and sampling; with ``--tree-width`` the tree runner's), so what is timed is what the host does
around it: run_draft's checks, the runner's bucket/buffer/graph look-ups, packing the inputs
into the staging (``_fill``), the results' conversion (drafts to lists, distributions cloned;
trees: the record's replay into the builder and the trees built). On a GPU the same call also
pays CUDA API calls (the upload, graph launches) and the wait for the device, which this does
not see; bench/gpu/bench_draft_loop.py measures those. ``--profile N``: cProfile's N most
expensive functions of the repeated calls.

This is a host-side benchmark; its numbers are this machine's Python speed, labelled as such.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _models(root: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
    from tiny_models import make_tiny_model, make_tokenizer

    tok = root / "tokenizer"
    make_tokenizer(tok)
    make_tiny_model(root / "target", "llama", tokenizer_dir=tok, seed=1)
    make_tiny_model(root / "draft", "llama", tokenizer_dir=tok, seed=1, layers=1)
    return root / "target", root / "draft"


def measure(target: Path, draft: Path, batch: int, temperature: float, k: int, reps: int, tree_width: int,
            profile: int) -> dict:
    import specd
    from specd.engine import engine as engine_module
    from specd.engine import model_runner
    from specd.engine.draft_graph import DraftGraphRunner
    from specd.engine.draft_tree_graph import DraftTreeGraphRunner

    spec = specd.SpeculationConfig(method="draft", num_speculative_tokens=k, draft_tree_width=tree_width)
    llm = specd.LLM(str(target), str(draft), spec, draft_graph=True, max_num_seqs=max(batch, 1))
    runner_cls = DraftTreeGraphRunner if tree_width > 1 else DraftGraphRunner
    owner, name = (engine_module, "run_draft_tree") if tree_width > 1 else (model_runner, "run_draft")
    real = getattr(owner, name)
    times: list[float] = []
    prof = cProfile.Profile() if profile else None
    seen = [0]

    def probed(model, pool, items, *args, **kw):
        seen[0] += 1
        if seen[0] == 2 and not times:  # the second call: every request past its prefill
            body = runner_cls._body
            runner_cls._body = lambda *a: None  # the device work: left out
            try:
                # The engine's call without its on_forward timer: (width, on_forward, size) for
                # trees, (on_forward,) for chains.
                timerless = (args[0], None, *args[2:]) if tree_width > 1 else (None, *args[1:])

                def call():
                    return real(model, pool, items, *timerless, **kw)
                for _ in range(3):
                    call()
                for _ in range(reps):
                    t0 = time.perf_counter()
                    call()
                    times.append((time.perf_counter() - t0) * 1e6)
                if prof is not None:
                    prof.enable()
                    for _ in range(reps):
                        call()
                    prof.disable()
            finally:
                runner_cls._body = body
        return real(model, pool, items, *args, **kw)

    setattr(owner, name, probed)
    try:
        prompts = [[5 + i, 6, 7, 8, 9, 10] for i in range(batch)]
        llm.generate(prompts, specd.SamplingParams(temperature=temperature, max_tokens=3 * k, ignore_eos=True,
                                                   seed=1))
    finally:
        setattr(owner, name, real)
    if not times:
        raise RuntimeError("the engine made fewer than two draft calls")
    median = statistics.median(times)
    row = {"batch": batch, "temperature": temperature, "k": k, "tree_width": tree_width, "reps": reps,
           "host_us_per_call": round(median, 1), "host_us_per_step": round(median / k, 1)}
    if prof is not None:
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(profile)
        row["profile"] = text.getvalue()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--temperatures", default="0,0.8", help="0: greedy rows; > 0: sampled rows")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tree-width", type=int, default=1, help="> 1: draft-model trees through the tree runner")
    ap.add_argument("--profile", type=int, default=0, help="print cProfile's N most expensive functions")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.k < 1 or args.reps < 1 or not 1 <= args.tree_width <= 8:
        ap.error("--k and --reps must be >= 1, --tree-width in [1, 8]")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = _models(Path(tmp))
        print(f"{'batch':>5} {'temp':>5} {'k':>3} {'width':>5} {'host us/call':>12} {'host us/step':>12}"
              "   (CPU host work only: device work left out)")
        for batch in (int(b) for b in args.batches.split(",")):
            for temperature in (float(t) for t in args.temperatures.split(",")):
                r = measure(target, draft, batch, temperature, args.k, args.reps, args.tree_width, args.profile)
                rows.append(r)
                print(f"{batch:>5} {temperature:>5} {args.k:>3} {args.tree_width:>5} {r['host_us_per_call']:>12.1f} "
                      f"{r['host_us_per_step']:>12.1f}", flush=True)
                if args.profile:
                    print(r["profile"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "note": "CPU host work of one draft call, device work left out"}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
