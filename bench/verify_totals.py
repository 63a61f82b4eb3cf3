"""Stochastic verification with and without the rows' totals (specd::verify_stochastic's
target_totals / draft_totals, verify_batch.h StochasticRowOptions): the walk reads a visited
node's rows whole to sum them, or takes the sums the sampling kernels wrote and reads two
entries per accept test.

    python bench/verify_totals.py [--batch 64] [--k 8] [--vocab 151936] [--reps 7] [--device cpu|cuda]

SYNTHETIC rows: softmax of N(0, 4) logits for the target. --accept of the requests draft the
target's argmax after each parent from draft rows that are the target's with noise (mostly
accepted); the others draft their own argmax from anti-correlated rows (softmax of -logits:
rejected at the first node, then the residual's draw). Times one op call (median of --reps interleaved
runs; on CUDA, events around the call). Outputs of the two forms are compared (equal on the
CPU: the totals there are the walk's own sums).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def sequential_totals(rows: torch.Tensor) -> torch.Tensor:
    """Each row's floats summed as doubles in id order (the kernels' totals on the CPU)."""
    return rows.double().cumsum(-1)[:, -1]


def synthetic_chains(n: int, k: int, vocab: int, accept: float, seed: int = 1) -> dict:
    """The SYNTHETIC chains of the module docstring (CPU tensors): target logits and rows, draft
    rows, the chains' tokens, parents, offsets and keys, and ``accepted`` (requests drafting the
    target's argmax)."""
    import specd.ops as ops

    width = k + 1
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n * width, vocab, generator=g) * 4
    target = torch.softmax(logits, -1)
    accepted = int(round(accept * n))
    draft = torch.softmax(logits + torch.randn(n * width, vocab, generator=g), -1)
    draft[accepted * width:] = torch.softmax(-logits[accepted * width:], -1)
    tokens = torch.zeros(n * width, dtype=torch.int32)
    chains = tokens.view(n, width)
    chains[:accepted, 1:] = target.argmax(-1).int().view(n, width)[:accepted, :-1]
    chains[accepted:, 1:] = draft.argmax(-1).int().view(n, width)[accepted:, :-1]
    return dict(logits=logits, target=target, draft=draft, tokens=tokens,
                parents=torch.arange(-1, k, dtype=torch.int32).repeat(n),
                offsets=torch.arange(0, n * width + 1, width, dtype=torch.int32),
                keys=ops.pack_rng_keys(torch.tensor(3), torch.arange(n), torch.tensor(0), torch.full((n,), 100)))


def time_calls(calls: dict, reps: int, dev: torch.device) -> dict:
    """ms of each call, ``reps`` interleaved runs (CUDA: events around the call)."""
    times = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            if dev.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                call()
                times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def run_and_time(calls: dict, reps: int, dev: torch.device, last: str) -> tuple:
    """Each call once (its outputs), whether all give equal outputs, the mean accepted count of
    call ``last`` and each call's times (time_calls)."""
    outs = {name: call() for name, call in calls.items()}
    same = all(torch.equal(a, b) for a, b in zip(*outs.values()))
    mean_accepted = float(outs[last][2].float().mean())
    return outs, same, mean_accepted, time_calls(calls, reps, dev)


def print_table(times: dict, base: str) -> None:
    """Median ms of each call and its speed-up over ``base``."""
    ref = statistics.median(times[base])
    for name in times:
        ms = statistics.median(times[name])
        print(f"  {name:<34} {ms:9.2f} ms   x{ref / ms:5.2f}")


def chain_arguments(doc: str, reps: int) -> argparse.ArgumentParser:
    """The synthetic chains' shape, acceptance, repetitions and device options."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--accept", type=float, default=1.0, help="share of requests whose chain is accepted")
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--device", default="cpu")
    return ap


def main(argv=None) -> int:
    args = chain_arguments(__doc__, 7).parse_args(argv)
    import specd.ops as ops

    dev = torch.device(args.device)
    n, k, vocab = args.batch, args.k, args.vocab
    c = {name: t.to(dev) for name, t in synthetic_chains(n, k, vocab, args.accept).items()}
    offsets, parents, tokens, target, draft, keys = (c[x] for x in ("offsets", "parents", "tokens", "target", "draft",
                                                                    "keys"))
    t_totals, d_totals = sequential_totals(target), sequential_totals(draft)
    calls = {
        "rows summed by the walk": lambda: ops.verify_stochastic(offsets, parents, tokens, target, draft, keys,
                                                                 cluster=True),
        "row totals given": lambda: ops.verify_stochastic(offsets, parents, tokens, target, draft, keys, cluster=True,
                                                          target_totals=t_totals, draft_totals=d_totals),
    }
    _, same, mean_accepted, times = run_and_time(calls, args.reps, dev, "row totals given")
    print(f"verify_stochastic, {n} chains x k {k} x vocab {vocab} (SYNTHETIC rows), device {dev}, "
          f"{args.accept:.0%} accepted chains (mean accepted {mean_accepted:.2f}), median of {args.reps}; "
          f"outputs equal: {same}")
    print_table(times, "rows summed by the walk")
    return 0 if same or dev.type == "cuda" else 1


if __name__ == "__main__":
    sys.exit(main())
