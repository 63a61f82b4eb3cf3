"""The sampling kernels' cases for a hardware-counter profile (Nsight Compute), run by
``bench/gpu/run.sh``'s opt-in ``profile`` stage under ``ncu --nvtx --nvtx-include profile/``.

Issue 7's unmet target "sampling within 2x of a device-memory-bandwidth bound" needs to know
what bounds the passes (docs/benchmarks.md: temperature sampling 35x, top-p 107x its bound at
64 rows of 151,936). Each case below makes one call inside the NVTX range ``profile/<case>``
(after one call outside it, so module loading and first-call work are not profiled), so ncu
profiles exactly one launch per case and its report names the case in the NVTX stack:

  greedy            sample_tokens, 64 rows bf16, temperature 0 (cluster per row)
  temperature       sample_tokens, 64 rows bf16, temperature 0.8 (cluster per row)
  temperature_1blk  the same with one thread block per row
  top_p             sample_tokens, 64 rows bf16, top-p 0.9 (cluster per row)
  draft_row         sample_tokens_and_probs, 1 row bf16, temperature 0.8 (cluster per row: the
                    draft loop's call)
  temperature_gumbel, top_p_gumbel, draft_row_gumbel
                    temperature, top_p and draft_row with the Gumbel-max draw (gumbel=True;
                    first timed on an H200 in the seventh GPU session)

Usage (the GPU machine): ``ncu --clock-control none --nvtx --nvtx-include "profile/" --section
SpeedOfLight ... python bench/gpu/profile_sampling.py``; ``--cases a,b`` picks cases.
``--time`` times the cases instead (no profiler; warm caches): device µs per call from CUDA
events around runs of ``--calls`` calls, the median of ``--reps`` runs, one line per case.
The calls are eager, so each also pays the op's host work (about 75 µs on the H100 host):
calls shorter than that measure the host. ``--graph`` captures the ``--calls`` calls in one
CUDA graph and times its replays instead: device time alone (first run on an H200 in the
seventh GPU session: docs/benchmarks.md).
Here:
``--smoke-cpu`` runs every case at a tiny vocabulary on the CPU references (checks the script;
profiles nothing), ``--dry-run`` lists the cases.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import torch

CASES = {  # name: (rows, temperature, top_p, cluster, with probabilities, Gumbel-max draw)
    "greedy": (64, 0.0, 1.0, True, False, False),
    "temperature": (64, 0.8, 1.0, True, False, False),
    "temperature_1blk": (64, 0.8, 1.0, False, False, False),
    "top_p": (64, 1.0, 0.9, True, False, False),
    "draft_row": (1, 0.8, 1.0, True, True, False),
    "temperature_gumbel": (64, 0.8, 1.0, True, False, True),
    "top_p_gumbel": (64, 1.0, 0.9, True, False, True),
    "draft_row_gumbel": (1, 0.8, 1.0, True, True, True),
}
VOCAB = 151936


def case_call(name: str, dev: torch.device, vocab: int, dtype: torch.dtype) -> Callable[[], object]:
    """The op call of case ``name`` on fresh random logits (``[rows, vocab]`` x 4, seeded)."""
    import specd.ops as ops

    rows, temp, top_p, cluster, with_probs, gumbel = CASES[name]
    g = torch.Generator(device=dev).manual_seed(0)
    logits = (torch.randn(rows, vocab, device=dev, generator=g) * 4).to(dtype)
    params = ops.pack_sampling_params(torch.full((rows,), temp, device=dev), torch.zeros(rows, device=dev),
                                      torch.full((rows,), top_p, device=dev), torch.zeros(rows, device=dev))
    keys = ops.pack_rng_keys(torch.tensor(7, device=dev), torch.arange(rows, device=dev), torch.tensor(1, device=dev),
                             torch.arange(rows, device=dev))
    if with_probs:
        return lambda: ops.sample_tokens_and_probs(logits, params, keys, cluster=cluster, gumbel=gumbel)
    if gumbel:
        return lambda: ops.sample_tokens(logits, params, keys, cluster=cluster, gumbel=True)
    return lambda: ops.sample_tokens(logits, params, keys, cluster=cluster)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    ap.add_argument("--smoke-cpu", action="store_true", help="tiny vocabulary on the CPU references")
    ap.add_argument("--dry-run", action="store_true", help="list the cases and exit")
    ap.add_argument("--time", action="store_true", help="time the cases (median device µs per call) instead")
    ap.add_argument("--reps", type=int, default=7, help="--time: runs per case (median)")
    ap.add_argument("--calls", type=int, default=20, help="--time: calls per run")
    ap.add_argument("--graph", action="store_true", help="--time on CUDA: replay the calls as one CUDA graph")
    args = ap.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    if args.dry_run:
        for c in names:
            rows, temp, top_p, cluster, with_probs, gumbel = CASES[c]
            print(f"{c}: {'sample_tokens_and_probs' if with_probs else 'sample_tokens'} {rows} x {VOCAB} bf16, "
                  f"temperature {temp}, top-p {top_p}, {'cluster' if cluster else 'one block'} per row"
                  f"{', Gumbel-max draw' if gumbel else ''}")
        return 0
    if args.smoke_cpu:
        dev, vocab, dtype = torch.device("cpu"), 512, torch.float32
    else:
        if not torch.cuda.is_available():
            print("profile_sampling: no CUDA device (use --smoke-cpu to check the script here)", file=sys.stderr)
            return 2
        dev, vocab, dtype = torch.device("cuda"), VOCAB, torch.bfloat16
    if args.time:
        return time_cases(names, dev, vocab, dtype, args.reps, args.calls, args.graph and dev.type == "cuda")
    for name in names:
        call = case_call(name, dev, vocab, dtype)
        call()  # outside the range: first-call work is not profiled
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("profile")
            torch.cuda.nvtx.range_push(name)
        out = call()
        if dev.type == "cuda":
            torch.cuda.nvtx.range_pop()
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
        status = out[-1]
        if bool(status.any()):
            print(f"{name}: a row's status is {status.tolist()}", file=sys.stderr)
            return 1
        print(f"{name}: one call profiled" if dev.type == "cuda" else f"{name}: ran on the CPU reference", flush=True)
    return 0


def captured(call: Callable[[], object], calls: int):
    """(replay, outputs): ``calls`` calls of ``call`` captured in one CUDA graph (after two
    warm-up calls on a side stream), and the last call's outputs, refreshed by each replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            out = call()
    return graph.replay, out


def time_cases(names, dev: torch.device, vocab: int, dtype: torch.dtype, reps: int, calls: int,
               graph: bool = False) -> int:
    """Median device (CUDA events; on the CPU wall-clock) µs per call of each case, printed as
    ``<case>: <µs> us per call (median of <reps> runs of <calls>[, CUDA graph])``; ``graph``:
    the runs replay one CUDA graph of the calls (``captured``)."""
    import statistics
    import time

    if reps < 1 or calls < 1:
        print("profile_sampling: --reps and --calls must be >= 1", file=sys.stderr)
        return 2
    for name in names:
        call = case_call(name, dev, vocab, dtype)
        out = call()
        if bool(out[-1].any()):
            print(f"{name}: a row's status is {out[-1].tolist()}", file=sys.stderr)
            return 1
        runs = []
        if graph:
            replay, out = captured(call, calls)
        for _ in range(reps):
            if dev.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                if graph:
                    replay()
                else:
                    for _ in range(calls):
                        call()
                end.record()
                end.synchronize()
                runs.append(start.elapsed_time(end) * 1e3 / calls)
            else:
                t0 = time.perf_counter()
                for _ in range(calls):
                    call()
                runs.append((time.perf_counter() - t0) * 1e6 / calls)
        if graph and bool(out[-1].any()):
            print(f"{name}: a row's status is {out[-1].tolist()} in the graph's replay", file=sys.stderr)
            return 1
        print(f"{name}: {statistics.median(runs):.1f} us per call (median of {reps} runs of {calls}"
              f"{', CUDA graph' if graph else ''})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
