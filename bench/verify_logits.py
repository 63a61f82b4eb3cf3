"""Sampled verification of a step from the target's logits: specd::verify_stochastic_logits (the
walk plans a visited node's row from its logits, only for the nodes it visits) against the path
it replaces, specd::sampling_probs writing every node's probability row and its total, then
specd::verify_stochastic reading them (verify_batch.h, TargetLogits).

    python bench/verify_logits.py [--batch 64] [--k 8] [--vocab 151936] [--accept 1.0]
                                  [--dtype float32|bfloat16] [--temperature 1.0] [--top-p 1.0]
                                  [--reps 5] [--device cpu|cuda]

SYNTHETIC chains, as bench/verify_totals.py makes them (N(0, 4) logits; --accept of the requests
draft the target's argmax, the others are rejected at their first node), the target's logits in
--dtype, every request with the same --temperature / --top-p. Both forms get the draft's row
totals. Times the whole step (median of --reps interleaved runs; on CUDA, events around the
calls; both with a thread-block cluster per row / request). The outputs of the two forms are
compared: equal on the CPU, where both fold their sums alike.
"""

from __future__ import annotations

import sys

import torch

from verify_totals import chain_arguments, print_table, run_and_time, sequential_totals, synthetic_chains


def main(argv=None) -> int:
    ap = chain_arguments(__doc__, 5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    args = ap.parse_args(argv)
    import specd.ops as ops

    dev = torch.device(args.device)
    n, k, vocab = args.batch, args.k, args.vocab
    c = synthetic_chains(n, k, vocab, args.accept)
    logits = c["logits"].to(getattr(torch, args.dtype)).to(dev)
    offsets, parents, tokens, draft, keys = (c[x].to(dev) for x in ("offsets", "parents", "tokens", "draft", "keys"))
    d_totals = sequential_totals(draft)

    def packed(rows: int) -> torch.Tensor:
        return ops.pack_sampling_params(torch.full((rows,), args.temperature, dtype=torch.float64),
                                        torch.zeros(rows, dtype=torch.int64),
                                        torch.full((rows,), args.top_p, dtype=torch.float64),
                                        torch.zeros(rows, dtype=torch.float64)).to(dev)

    node_params, request_params = packed(len(tokens)), packed(n)
    t_totals = torch.empty(len(tokens), dtype=torch.float64, device=dev)

    def rows_then_verify():
        probs, _ = ops.sampling_probs(logits, node_params, True, t_totals)
        return ops.verify_stochastic(offsets, parents, tokens, probs, draft, keys, cluster=True,
                                     target_totals=t_totals, draft_totals=d_totals)

    calls = {
        "sampling_probs + verify_stochastic": rows_then_verify,
        "verify_stochastic_logits": lambda: ops.verify_stochastic_logits(
            offsets, parents, tokens, logits, request_params, draft, keys, cluster=True, draft_totals=d_totals),
    }
    outs, same, mean_accepted, times = run_and_time(calls, args.reps, dev, "verify_stochastic_logits")
    ok = not bool(outs["verify_stochastic_logits"][3].any())
    print(f"sampled verification, {n} chains x k {k} x vocab {vocab} (SYNTHETIC), {args.dtype} logits, "
          f"temperature {args.temperature}, top-p {args.top_p}, device {dev}, {args.accept:.0%} accepted chains "
          f"(mean accepted {mean_accepted:.2f}), median of {args.reps}; outputs equal: {same}")
    print_table(times, "sampling_probs + verify_stochastic")
    return 0 if ok and (same or dev.type == "cuda") else 1


if __name__ == "__main__":
    sys.exit(main())
