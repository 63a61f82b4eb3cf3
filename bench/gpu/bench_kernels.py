"""Times specd's CUDA kernels (through the torch custom ops of specd.ops) against the torch /
host paths the engine uses today, on the lent GPU, and checks they agree.

    python bench/gpu/bench_kernels.py [--quick] [--out DIR] [--only NAME ...] [--dry-run]

Cases (sizes of the real pair, Qwen2.5-Coder 1.5B / 0.5B: vocab 151,936, kv_heads 2,
head_dim 128 (target) / 64 (draft), 28 layers, bf16 KV, block 16):
  sampling       batch 64 x vocab 152k, mixed greedy / temperature / top-k / top-p rows:
                 ops.sample_tokens and ops.sampling_probs vs the batched torch rows
                 (engine/row_sampling.py) and the per-row torch loop (torch_sampling.py)
  verification   batch 64 x k 8 chains (576 nodes) x vocab 152k: ops.verify_greedy and
                 ops.verify_stochastic vs the engine's host path (argmax / rows to the host,
                 then specd.verification per request)
  kv_write       64 and 4096 new tokens into one layer's strided pool view: ops.kv_write vs
                 models.attention.write_kv
  kv_compact     64 requests x 28 layers, accepted paths of a 9-node tree: ops.kv_compact on
                 stacked_kv vs a per-layer torch gather/scatter (KVCachePool.copy_slots)
  tree_attention 64 requests x (history 512 / 2048 + 9 tree nodes), 12 q heads: kv_write +
                 ops.tree_attention vs TorchPagedAttention.forward (write + per-sequence SDPA)

Timing: CUDA events per call, warm-up first, median of the repetitions; host paths with a
synchronised wall clock. Prints a table; writes bench_kernels.json under --out ($OUT, else
bench-results/). --dry-run checks the imports and prints the plan without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

CASES = ("sampling", "verification", "kv_write", "kv_compact", "tree_attention")


@dataclass(frozen=True)
class Setup:
    """Sizes and device of one run: the real pair's on the GPU; tiny ones for --smoke-cpu."""

    dev: torch.device
    reps: int
    vocab: int = 151_936
    batch: int = 64
    k: int = 8
    layers: int = 28
    pages: int = 4096
    write_tokens: tuple = (64, 4096)
    histories: tuple = (512, 2048)
    dtype: torch.dtype = torch.bfloat16

    def time(self, fn: Callable[[], object], warmup: int = 3, reps: Optional[int] = None) -> float:
        reps = reps or self.reps
        return cuda_ms(fn, warmup, reps) if self.dev.type == "cuda" else wall_ms(fn, 1, reps)


SMOKE = dict(vocab=1000, batch=4, k=3, layers=2, pages=64, write_tokens=(8,), histories=(20,), dtype=torch.float32)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def cuda_ms(fn: Callable[[], object], warmup: int, reps: int) -> float:
    """Median milliseconds of fn() on the current stream (CUDA events)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def wall_ms(fn: Callable[[], object], warmup: int, reps: int) -> float:
    """Median milliseconds of fn() including host work (synchronised wall clock)."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for _ in range(warmup):
        fn()
    sync(dev)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def row(case: str, shape: str, specd_ms: float, baseline: str, base_ms: float, check: str) -> dict:
    return {"case": case, "shape": shape, "specd_ms": round(specd_ms, 4), "baseline": baseline,
            "baseline_ms": round(base_ms, 4), "speedup": round(base_ms / specd_ms, 2) if specd_ms else None,
            "check": check}


def bench_sampling(s: Setup) -> list[dict]:
    import specd.ops as ops
    from specd.engine.params import SamplingParams
    from specd.engine.row_sampling import RowParams, row_sampling_probs, sample_rows
    from specd.engine.torch_sampling import sampling_probs

    dev, n = s.dev, s.batch
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(n, s.vocab, device=dev, generator=g) * 4
    kinds = [(0.0, 0, 1.0), (0.8, 0, 1.0), (0.7, 50, 1.0), (1.0, 0, 0.9)]
    temp, top_k, top_p = (torch.tensor([kinds[i % 4][j] for i in range(n)], device=dev) for j in range(3))
    params = ops.pack_sampling_params(temp, top_k, top_p, torch.zeros(n, device=dev))
    keys = ops.pack_rng_keys(torch.tensor(7, device=dev), torch.arange(n, device=dev), torch.tensor(1, device=dev),
                             torch.arange(n, device=dev))
    rp = RowParams(greedy=temp == 0, temperature=torch.where(temp == 0, 1.0, temp).double(), top_k=top_k.long(),
                   top_p=top_p.double(), min_p=torch.zeros(n, dtype=torch.float64, device=dev),
                   seed_lo=torch.full((n,), 7, device=dev), seed_hi=torch.zeros(n, dtype=torch.int64, device=dev),
                   request=torch.arange(n, device=dev))
    positions = torch.arange(n, device=dev)
    tokens, status = ops.sample_tokens(logits, params, keys)
    probs, _ = ops.sampling_probs(logits, params)
    ref = row_sampling_probs(logits, rp)
    greedy_ok = torch.equal(tokens[temp == 0].long(), logits[temp == 0].argmax(-1))
    err = float((probs.double() - ref).abs().max())
    check = f"status ok={not bool(status.any())}, greedy equal={greedy_ok}, probs max|diff|={err:.1e}"
    py_params = [SamplingParams(temperature=float(t), top_k=int(k), top_p=float(p)) for t, k, p in
                 zip(temp.tolist(), top_k.tolist(), top_p.tolist())]
    shape = f"{n} x {s.vocab}"
    sample = s.time(lambda: ops.sample_tokens(logits, params, keys))
    return [
        row("sample_tokens", shape, sample, "torch batched rows", s.time(lambda: sample_rows(logits, rp, 1, positions)),
            check),
        row("sampling_probs", shape, s.time(lambda: ops.sampling_probs(logits, params)), "torch batched rows",
            s.time(lambda: row_sampling_probs(logits, rp)), check),
        row("sample_tokens", shape, sample, "torch per-row loop",
            wall_ms(lambda: [sampling_probs(logits[r], p) for r, p in enumerate(py_params)], 1, max(3, s.reps // 4)),
            "the plain draft loop's per-row path"),
    ]


def random_chains(s: Setup, g):
    width = s.k + 1
    parents = torch.arange(-1, s.k, device=s.dev, dtype=torch.int32).repeat(s.batch)  # local parent: v - 1
    tokens = torch.randint(0, s.vocab, (s.batch * width,), device=s.dev, generator=g, dtype=torch.int64).int()
    offsets = torch.arange(0, s.batch * width + 1, width, device=s.dev, dtype=torch.int32)
    return offsets, parents, tokens


def bench_verification(s: Setup) -> list[dict]:
    import specd.ops as ops
    from specd.verification import TokenTree, verify, verify_greedy_tokens

    dev, n, width = s.dev, s.batch, s.k + 1
    g = torch.Generator(device=dev).manual_seed(1)
    offsets, parents, tokens = random_chains(s, g)
    nodes = n * width
    logits = torch.randn(nodes, s.vocab, device=dev, generator=g) * 4
    # Every other request drafts its parent rows' argmax (all accepted greedily), the rest random.
    chains = tokens.view(n, width)
    chains[::2, 1:] = logits.argmax(-1).int().view(n, width)[::2, :-1]
    target_probs = torch.softmax(logits, -1)
    draft_probs = torch.softmax(logits + torch.randn(nodes, s.vocab, device=dev, generator=g), -1)
    keys = ops.pack_rng_keys(torch.tensor(3, device=dev), torch.arange(n, device=dev), torch.tensor(0, device=dev),
                             torch.full((n,), 100, device=dev))
    host_tokens = tokens.cpu().numpy().reshape(n, width)
    trees = [TokenTree.chain(int(t[0]), t[1:].astype(np.int32)) for t in host_tokens]

    def host_greedy():
        argmax = logits.argmax(-1).cpu()
        return [verify_greedy_tokens(argmax[r * width:(r + 1) * width], trees[r]) for r in range(n)]

    def host_stochastic():
        t, d = target_probs.cpu().numpy(), draft_probs.cpu().numpy()
        return [verify(t[r * width:(r + 1) * width], trees[r], d[r * width:(r + 1) * width], seed=3, request=r,
                       position=100) for r in range(n)]

    got_g = ops.verify_greedy(offsets, parents, tokens, logits, width)
    got_s = ops.verify_stochastic(offsets, parents, tokens, target_probs, draft_probs, keys, "without_replacement",
                                  width)
    want_g, want_s = host_greedy(), host_stochastic()
    same_g = got_g[2].tolist() == [o.num_accepted for o in want_g]
    same_s = got_s[2].tolist() == [o.num_accepted for o in want_s] and all(
        got_s[0][r, :o.num_accepted + 1].tolist() == list(o.tokens) for r, o in enumerate(want_s))
    shape = f"{n} x k {s.k} x {s.vocab}"
    return [
        row("verify_greedy", shape, s.time(lambda: ops.verify_greedy(offsets, parents, tokens, logits, width)),
            "argmax + host verify", wall_ms(host_greedy, 1, s.reps), f"equal to host={same_g}"),
        row("verify_stochastic", shape,
            s.time(lambda: ops.verify_stochastic(offsets, parents, tokens, target_probs, draft_probs, keys,
                                                 "without_replacement", width)),
            "rows to host + verify", wall_ms(host_stochastic, 1, max(3, s.reps // 4)), f"equal to host={same_s}"),
    ]


def pool_views(s: Setup, pages, layers, g, heads=2, dim=128, block=16):
    from specd.models.attention import LayerKV

    storage = torch.randn(pages, layers, 2, block, heads, dim, device=s.dev, generator=g).to(s.dtype)
    return storage, [LayerKV(storage[:, i, 0], storage[:, i, 1]) for i in range(layers)]


def bench_kv_write(s: Setup) -> list[dict]:
    import specd.ops as ops
    from specd.models.attention import LayerKV, write_kv

    g = torch.Generator(device=s.dev).manual_seed(2)
    out = []
    for tokens in s.write_tokens:
        storage, layers = pool_views(s, s.pages, s.layers, g)
        slots = torch.randperm(s.pages * 16, device=s.dev, generator=g)[:tokens]
        k, v = (torch.randn(tokens, 2, 128, device=s.dev, generator=g).to(s.dtype) for _ in range(2))
        other = storage.clone()
        layer_b = LayerKV(other[:, 0, 0], other[:, 0, 1])
        ops.kv_write(layers[0].k, layers[0].v, k, v, slots)
        write_kv(layer_b, k, v, slots)
        check = f"equal={torch.equal(storage, other)}"
        out.append(row("kv_write", f"{tokens} tok, 2x128 {str(s.dtype)[6:]}",
                       s.time(lambda: ops.kv_write(layers[0].k, layers[0].v, k, v, slots)),
                       "torch index_put", s.time(lambda: write_kv(layer_b, k, v, slots)), check))
    return out


def bench_kv_compact(s: Setup) -> list[dict]:
    import specd.ops as ops

    dev, n, bs, width = s.dev, s.batch, 16, 8
    g = torch.Generator(device=dev).manual_seed(3)
    storage, layers = pool_views(s, max(s.pages // 2, n * width), s.layers, g)
    table = torch.randperm(storage.shape[0], device=dev, generator=g)[:n * width].view(n, width).int()
    tree_start = torch.randint(0, 100, (n,), device=dev, generator=g).int()
    path = torch.tensor([0, 1, 3, 4, 6, 8, -1, -1, -1], device=dev, dtype=torch.int32).repeat(n, 1)
    accepted = torch.full((n,), 5, device=dev, dtype=torch.int32)
    k5, v5 = ops.stacked_kv(layers)
    other = storage.clone()
    # The torch path: the slots of every move, then one gather/scatter per layer (copy_slots).
    d = torch.arange(1, 6, device=dev)
    src_pos, dst_pos = tree_start[:, None] + path[:, 1:6], tree_start[:, None] + d[None]
    src, dst = ((table.gather(1, (p // bs).long()).long() * bs + p % bs).reshape(-1) for p in (src_pos, dst_pos))

    def torch_path():
        sp, so, dp, do = src // bs, src % bs, dst // bs, dst % bs
        for i in range(s.layers):
            for kv in range(2):
                view = other[:, i, kv]
                view[dp, do] = view[sp, so]

    ops.kv_compact(k5, v5, table, tree_start, path, accepted)
    torch_path()
    check = f"equal={torch.equal(storage, other)}"
    return [row("kv_compact", f"{n} req x {s.layers} layers, 5 moves",
                s.time(lambda: ops.kv_compact(k5, v5, table, tree_start, path, accepted)),
                "torch gather/scatter per layer", s.time(torch_path), check)]


def bench_tree_attention(s: Setup) -> list[dict]:
    import specd.ops as ops
    from specd.models.attention import AttentionMetadata, TorchPagedAttention

    dev, n, bs, nodes = s.dev, s.batch, 16, s.k + 1
    g = torch.Generator(device=dev).manual_seed(4)
    out = []
    for history in s.histories:
        width = -(-(history + nodes) // bs)
        storage, layers = pool_views(s, n * width + 8, 1, g)
        cache = layers[0]
        table = torch.randperm(n * width + 8, device=dev, generator=g)[:n * width].view(n, width).int()
        kv_lens = torch.full((n,), history + nodes, device=dev, dtype=torch.int32)
        starts = torch.arange(0, n * nodes + 1, nodes, device=dev, dtype=torch.int32)
        pos = torch.arange(history, history + nodes, device=dev)
        slot_map = (table.gather(1, (pos // bs)[None].expand(n, -1)).long() * bs + pos % bs).reshape(-1)
        q = torch.randn(n * nodes, 12, 128, device=dev, generator=g).to(s.dtype)
        k, v = (torch.randn(n * nodes, 2, 128, device=dev, generator=g).to(s.dtype) for _ in range(2))
        meta = AttentionMetadata(query_start=starts.tolist(), kv_lens=kv_lens.tolist(), block_tables=table.long(),
                                 slot_mapping=slot_map, positions=pos.repeat(n), masks=[None] * n)
        torch_backend = TorchPagedAttention()

        def specd_path():
            ops.kv_write(cache.k, cache.v, k, v, slot_map)
            return ops.tree_attention(q, cache.k, cache.v, table, starts, kv_lens)

        want, got = torch_backend.forward(q, k, v, cache, meta, None), specd_path()
        rel = float((got.float() - want.float()).norm() / want.float().norm())
        out.append(row("tree_attention", f"{n} req x ({history} + {nodes}), 12/2 heads x 128",
                       s.time(specd_path), "TorchPagedAttention (write + SDPA)",
                       wall_ms(lambda: torch_backend.forward(q, k, v, cache, meta, None), 2, s.reps),
                       f"rel err={rel:.1e}"))
    return out


BENCHES = {"sampling": bench_sampling, "verification": bench_verification, "kv_write": bench_kv_write,
           "kv_compact": bench_kv_compact, "tree_attention": bench_tree_attention}


def print_table(rows: list[dict]) -> None:
    print(f"{'case':<18} {'shape':<42} {'specd ms':>9} {'baseline ms':>12} {'x':>6}  baseline / check")
    for r in rows:
        print(f"{r['case']:<18} {r['shape']:<42} {r['specd_ms']:>9.3f} {r['baseline_ms']:>12.3f} "
              f"{r['speedup'] or 0:>6.2f}  {r['baseline']} / {r['check']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="check imports and print the plan (no GPU needed)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--only", nargs="*", choices=CASES, help="cases to run (default all)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench-results", help="folder of bench_kernels.json")
    ap.add_argument("--smoke-cpu", action="store_true",
                    help="run every case at tiny sizes on the CPU (float32 references): checks the script, times nothing")
    args = ap.parse_args(argv)
    import specd.ops as ops
    from specd import _core

    cases = args.only or list(CASES)
    reps = 10 if args.quick else 30
    print(f"specd {_core.__version__}: CUDA kernels built={ops.HAS_CUDA_KERNELS}, torch {torch.__version__}, "
          f"cuda available={torch.cuda.is_available()}")
    print(f"plan: {', '.join(cases)}; {reps} repetitions (median); JSON -> {args.out}/bench_kernels.json")
    if args.dry_run:
        missing = [n for n in ("kv_write_cuda", "tree_attention_cuda", "sample_tokens_batch_cuda",
                               "verify_stochastic_batch_cuda") if not hasattr(_core, n)]
        print("dry run: imports ok" + (f"; this _core lacks {missing} (built without CUDA)" if missing else ""))
        return 0
    if args.smoke_cpu:
        setup = Setup(torch.device("cpu"), 2, **SMOKE)
    elif not torch.cuda.is_available() or not ops.HAS_CUDA_KERNELS:
        print("needs a CUDA device and a specd build with CUDA kernels (or --smoke-cpu)", file=sys.stderr)
        return 2
    else:
        setup = Setup(torch.device("cuda"), reps)
    rows, errors = [], {}
    for name in cases:
        try:
            rows += BENCHES[name](setup)
        except Exception as e:  # one broken case must not hide the others' numbers
            errors[name] = f"{type(e).__name__}: {e}"
            print(f"[{name}] FAILED: {errors[name]}", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name() if setup.dev.type == "cuda" else "cpu (smoke)",
            "torch": torch.__version__, "reps": setup.reps}
    with open(os.path.join(args.out, "bench_kernels.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "errors": errors}, f, indent=1)
    print_table(rows)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
