"""Where an engine step leaves the GPU idle: a timeline of whole engine steps (draft model,
chains, both graph runners: LLM's default on CUDA) under torch.profiler, the host's work
labelled by phase, and every interval in which the GPU runs nothing attributed to the host
phase that was running then (the innermost label; "python (unlabelled)" for the rest).

    python bench/gpu/step_timeline.py [--batches 1,8] [--k 4] [--tokens 24] [--json F] [--smoke-cpu]

Models: bench_draft_loop.py's random-weight bf16 models shaped like the real pair (acceptance
is meaningless, costs are not). For each batch, two runs of the same greedy requests, after a
warm-up run (graph capture): the drafts read on the host between the draft call and the
verify forward (``Engine.device_drafts = False``) and kept on the device (the default). Each
run is profiled whole (CPU and CUDA activity; the profiler's own per-launch cost inflates
the host side somewhat, equally in both runs).

Per run: engine steps, step µs (the "step" label's median length), GPU busy µs per step
(union of kernel and copy intervals inside steps), GPU idle µs per step (step time minus
busy), and the idle time per step attributed to each host phase (the JSON also has the whole
step's time by phase, "host_us_per_step_by_phase": where the host's time goes, overlapped
with the GPU or not):

    plan            Scheduler.schedule (the C++ StepPlanner, the policy's decision)
    draft inputs    DraftGraphRunner._fill (pack + upload of the draft call's inputs)
    graph launch    CUDAGraph.replay (launching a captured graph)
    draft call      model_runner.run_draft_on_device outside the labels above (the runner's
                    Python around its inputs and launches)
    read drafts     model_runner.run_draft (its .tolist() of the drafts) / Engine._place_drafts
    verify inputs   TargetGraphRunner._fill (pack + upload); drafts into inputs: _put_drafts
    verification    batch_verify.verify_inputs (the argmax or stochastic verification read)
    accept          Engine._accept (KV commits, slot moves, emitting tokens, metrics)
    settle          Engine._settle_forwards (the forwards' CUDA event times read)
    propose         Engine._propose outside the labels above (trees, distributions)
    target          model_runner.run_target outside the labels above

--smoke-cpu: tiny float32 models on the CPU (no GPU activity: every interval counts as idle);
checks the script, measures nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_draft_loop import configs, device_and_dtype, random_model  # noqa: E402

UNLABELLED = "python (unlabelled)"
STEP = "step"


def merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def idle_within(window: tuple[float, float], busy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of ``window`` that no interval of ``busy`` (merged, sorted) covers."""
    a, b = window
    gaps, at = [], a
    for s, e in busy:
        if e <= at or s >= b:
            continue
        if s > at:
            gaps.append((at, s))
        at = max(at, e)
    if at < b:
        gaps.append((at, b))
    return gaps


def attribute(gaps: list[tuple[float, float]], labels: list[tuple[str, float, float]]) -> dict[str, float]:
    """Each gap's time split over the host labels running in it: at every instant, the
    innermost (shortest) label interval containing it, else UNLABELLED. Returns label -> time."""
    out: dict[str, float] = {}
    for g0, g1 in gaps:
        inside = [(name, max(a, g0), min(b, g1), b - a) for name, a, b in labels if a < g1 and b > g0]
        cuts = sorted({g0, g1, *(x for _, a, b, _ in inside for x in (a, b))})
        for s, e in zip(cuts, cuts[1:]):
            if e <= s:
                continue
            mid = (s + e) / 2
            active = [(length, name) for name, a, b, length in inside if a <= mid < b]
            name = min(active)[1] if active else UNLABELLED
            out[name] = out.get(name, 0.0) + (e - s)
    return out


def summarize(steps: list[tuple[float, float]], gpu: list[tuple[float, float]],
              labels: list[tuple[str, float, float]]) -> dict:
    """Per step (medians, µs): its length, the GPU's busy and idle time in it; the idle time
    attributed to each label, and the step's whole time attributed to each label (the host's
    time by phase, overlapped or not), each summed over the steps and divided by their number."""
    busy = merge(gpu)
    lengths, busy_per, idle_per, by_label, host_by_label = [], [], [], {}, {}
    for window in steps:
        gaps = idle_within(window, busy)
        idle = sum(b - a for a, b in gaps)
        lengths.append(window[1] - window[0])
        idle_per.append(idle)
        busy_per.append(lengths[-1] - idle)
        inner = [x for x in labels if x[0] != STEP and x[1] < window[1] and x[2] > window[0]]
        for totals, spans in ((by_label, gaps), (host_by_label, [window])):
            for name, t in attribute(spans, inner).items():
                totals[name] = totals.get(name, 0.0) + t
    n = max(1, len(steps))
    med = lambda xs: round(statistics.median(xs), 1) if xs else None  # noqa: E731
    per_step = lambda totals: {k: round(v / n, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}  # noqa: E731
    return {"steps": len(steps), "step_us": med(lengths), "gpu_busy_us_per_step": med(busy_per),
            "gpu_idle_us_per_step": med(idle_per), "idle_us_per_step_by_phase": per_step(by_label),
            "host_us_per_step_by_phase": per_step(host_by_label)}


def _labelled(fn, label: str):
    from torch.profiler import record_function

    def wrapped(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)
    return wrapped


def install_labels(stack: ExitStack) -> None:
    """Wraps the engine's phases in profiler labels (this script only; undone by ``stack``)."""
    from specd.engine import engine as engine_module
    from specd.engine import model_runner
    from specd.engine.draft_graph import DraftGraphRunner
    from specd.engine.engine import Engine
    from specd.engine.scheduler import Scheduler
    from specd.engine.target_graph import TargetGraphRunner

    targets = [(Engine, "step", STEP), (Scheduler, "schedule", "plan"), (Engine, "_propose", "propose"),
               (DraftGraphRunner, "_fill", "draft inputs"), (torch.cuda.CUDAGraph, "replay", "graph launch"),
               (model_runner, "run_draft", "read drafts"), (Engine, "_place_drafts", "read drafts"),
               (model_runner, "run_draft_on_device", "draft call"),
               (model_runner, "run_target", "target"), (TargetGraphRunner, "_fill", "verify inputs"),
               (TargetGraphRunner, "_put_drafts", "verify inputs"), (engine_module, "verify_inputs", "verification"),
               (Engine, "_accept", "accept"), (Engine, "_settle_forwards", "settle")]
    for owner, name, label in targets:
        real = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        if isinstance(real, staticmethod):
            setattr(owner, name, staticmethod(_labelled(real.__func__, label)))
        else:
            setattr(owner, name, _labelled(real, label))
        stack.callback(setattr, owner, name, real)


def profile_run(llm, prompts, params, names: set[str]) -> tuple[dict, list]:
    """One generate under the profiler: the summary and the outputs."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available() and llm.target.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        outs = llm.generate(prompts, params)
        if cuda:
            torch.cuda.synchronize()
    events = prof.events()
    gpu = [(e.time_range.start, e.time_range.end) for e in events
           if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start]
    labels = [(e.name, e.time_range.start, e.time_range.end) for e in events
              if e.device_type == DeviceType.CPU and e.name in names]
    steps = [(a, b) for name, a, b in labels if name == STEP]
    return summarize(steps, gpu, labels), [o.token_ids for o in outs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--smoke-cpu", action="store_true", help="tiny float32 models on the CPU: checks the script")
    args = ap.parse_args(argv)
    import specd

    batches = [int(b) for b in args.batches.split(",")]
    placed = device_and_dtype(args.smoke_cpu)
    if placed is None:
        return 2
    dev, dtype = placed
    torch.manual_seed(0)
    target_cfg, draft_cfg = configs(args.smoke_cpu)
    target, draft = random_model(target_cfg, dev, dtype), random_model(draft_cfg, dev, dtype)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, target_cfg.vocab_size, (int(n),), generator=gen).tolist()
               for n in torch.randint(16, 200, (max(batches),), generator=gen)]
    params = specd.SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    names = {STEP, "plan", "propose", "draft inputs", "graph launch", "draft call", "read drafts", "target",
             "verify inputs", "verification", "accept", "settle"}
    rows = []
    print(f"{'batch':>5} {'drafts':<10} {'steps':>5} {'step us':>9} {'gpu busy':>9} {'gpu idle':>9}  "
          "idle us per step by host phase", flush=True)
    with ExitStack() as stack:
        install_labels(stack)
        for batch in batches:
            spec = specd.SpeculationConfig(method="draft", num_speculative_tokens=args.k)
            llm = specd.LLM.from_models(target, draft, spec, device=dev, max_num_seqs=batch, max_model_len=2048,
                                        num_kv_pages=4096 if dev == "cuda" else 256, draft_graph=True,
                                        target_graph=True)
            llm.generate(prompts[:batch], params)  # warm-up: graph capture
            outputs = {}
            for on_device in (False, True):
                llm.engine.device_drafts = on_device
                t0 = time.perf_counter()
                summary, outputs[on_device] = profile_run(llm, prompts[:batch], params, names)
                row = {"batch": batch, "k": args.k, "device_drafts": on_device,
                       "profiled_run_s": round(time.perf_counter() - t0, 2), **summary}
                rows.append(row)
                phases = ", ".join(f"{k} {v:.0f}" for k, v in row["idle_us_per_step_by_phase"].items())
                print(f"{batch:>5} {'on device' if on_device else 'host read':<10} {row['steps']:>5} "
                      f"{row['step_us']:>9.1f} {row['gpu_busy_us_per_step']:>9.1f} {row['gpu_idle_us_per_step']:>9.1f}  "
                      f"{phases}", flush=True)
            if outputs[True] != outputs[False]:
                print(f"batch {batch}: OUTPUTS DIFFER between the two runs", file=sys.stderr)
                return 1
    if args.json:
        meta = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)",
                "torch": torch.__version__, "tokens": args.tokens}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
