"""Times specd's CUDA kernels (through the torch custom ops of specd.ops) against the torch /
host paths the engine uses today, on the lent GPU, checks they agree, and sets each against
a memory-bandwidth lower bound.

    python bench/gpu/bench_kernels.py [--quick] [--out DIR] [--only NAME ...] [--dry-run] [--smoke-cpu]

Cases (sizes of the real pair, Qwen2.5-Coder 1.5B / 0.5B: vocab 151,936, kv_heads 2,
head_dim 128 (target) / 64 (draft), 28 layers, bf16 KV, block 16):
  sampling       64 x 152k logits, one row per mode: greedy-only, temperature-only (0.8),
                 top-k 50, top-p 0.9, mixed (the four modes in turn), each with bf16 and fp32
                 logits: ops.sample_tokens vs the batched torch rows (torch_row_sampling.py, the
                 draft graph's sampling before it called the kernel); ops.sampling_probs (mixed);
                 the per-row torch loop (torch_row_sampling.row_loop_sampling_probs, mixed fp32); and what the draft
                 loop runs now, ops.sample_tokens_and_probs, vs the torch rows at 1, 8 and 64
                 rows (temperature 0.8 and top-p 0.9, bf16), and its _out form (what the draft
                 graph calls) vs the functional op plus a copy into the buffer; "... cluster":
                 the same calls with cluster=True (a thread-block cluster of 8 blocks per row,
                 sm_90+) vs one block per row; "... cluster gumbel": the Gumbel-max draw
                 (gumbel=True) vs the clustered inverse-CDF draw (sample_tokens' sampled modes,
                 sample_tokens_and_probs' rows)
  verification   64 x k 8 chains (576 nodes) x 152k: ops.verify_greedy from the logits (fp32 and
                 bf16 rows) and ops.verify_greedy_tokens from the target's token ids (the
                 "<20 us for batch 64 x k 8 x vocab 152k" target: no logits read at all) vs
                 argmax / token ids to the host + specd.verification per request;
                 ops.verify_stochastic vs rows to the host + verify, and with cluster=True
                 (a thread-block cluster per request) vs one block per request
  kv_write       64 and 4096 new tokens into one layer's strided pool view: ops.kv_write vs
                 models.attention.write_kv
  kv_compact     64 requests x 28 layers, accepted paths of a 9-node tree: ops.kv_compact on
                 stacked_kv vs a per-layer torch gather/scatter (KVCachePool.copy_slots)
  tree_attention 64 requests x (history 512 / 2048 + 9 tree nodes), 12 q heads: kv_write +
                 ops.tree_attention vs TorchPagedAttention.forward (write + per-sequence SDPA);
                 "tree_attention grouped": the split, head-grouped kernel (grouped=True) vs the
                 per-head kernel, attention alone, at those shapes and at 1 request x (4096 /
                 32768 + 9)

Timing, per op and baseline:
  dev us   device time per call: C back-to-back calls (C = up to 20, fewer for slow calls)
           captured in one torch.cuda.CUDAGraph, replayed under CUDA events, median over the
           repetitions / C ("graph xC"). Where a call cannot be captured (it synchronises with
           the host), C back-to-back eager calls under CUDA events ("eager xC", which then
           includes the host's share); host paths (data to the host, verify there): a
           synchronised wall clock ("wall").
  host us  host time per call: wall clock of N eager calls without a synchronisation in
           between, / N (what the calling thread pays; the launch latency of small kernels).
  bound us bytes the op must read + write / peak bandwidth, the bandwidth measured in the same
           run by a >= 1 GiB device-to-device copy (bytes read + written / time); "bw %" =
           bound / dev. verify_stochastic's bound reads every node's target and draft rows
           once (the work when all drafts are visited); verify_greedy_tokens has none (its
           inputs are a few KB: it is launch-bound).
Prints a table; writes bench_kernels.json under --out ($OUT, else bench-results/). --dry-run
checks the imports and prints the plan without a GPU; --smoke-cpu runs every case at tiny
sizes on the CPU references (times nothing meaningful).
"""

from __future__ import annotations

import argparse
import dataclasses
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
MAX_CALLS = 20          # calls per captured graph / host-time batch
TARGET_BATCH_MS = 2.0   # fewer calls per graph for slow ops (a replay of ~2 ms is plenty)


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
    long_histories: tuple = (4096, 32768)  # batch 1: the split-KV cases
    dtype: torch.dtype = torch.bfloat16
    bandwidth: float = 0.0  # bytes / s, measured (peak_bandwidth)

    @property
    def cuda(self) -> bool:
        return self.dev.type == "cuda"

    def measure(self, fn: Callable[[], object], capture: bool = True) -> dict:
        """Device and host microseconds per call of fn (module doc)."""
        return measure_cuda(fn, self.reps, capture) if self.cuda else measure_cpu(fn, self.reps)

    def wall(self, fn: Callable[[], object], reps: Optional[int] = None) -> dict:
        """A host path (synchronises by itself): synchronised wall clock per call."""
        us = wall_ms(fn, 1, reps or self.reps) * 1e3
        return {"dev_us": us, "host_us": us, "timing": "wall"}

    def bound_us(self, nbytes: float) -> Optional[float]:
        return nbytes / self.bandwidth * 1e6 if self.bandwidth and nbytes else None


SMOKE = dict(vocab=1000, batch=4, k=3, layers=2, pages=64, write_tokens=(8,), histories=(20,),
             long_histories=(300,), dtype=torch.float32)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def events_ms(run: Callable[[], object], reps: int) -> float:
    """Median milliseconds of run() on the current stream (CUDA events)."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def host_us(fn: Callable[[], object], calls: int, dev: torch.device) -> float:
    """Wall clock of `calls` eager calls without a synchronisation in between, per call (median
    of 3 batches), synchronising only before and after each batch."""
    times = []
    for _ in range(3):
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
        sync(dev)
    return statistics.median(times)


def measure_cuda(fn: Callable[[], object], reps: int, capture: bool = True) -> dict:
    current = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):  # warm-up (lazy initialisations) off the capture stream
        for _ in range(2):
            fn()
    current.wait_stream(side)
    torch.cuda.synchronize()
    one = events_ms(fn, 3)
    calls = max(1, min(MAX_CALLS, int(TARGET_BATCH_MS / max(one, 1e-3))))
    dev_ms, timing = None, None
    if capture:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    fn()
            graph.replay()
            torch.cuda.synchronize()
            dev_ms, timing = events_ms(graph.replay, reps) / calls, f"graph x{calls}"
        except Exception as e:  # the op synchronises with the host (or is otherwise not capturable)
            torch.cuda.set_stream(current)  # a failed capture_end can leave the capture stream current
            torch.cuda.synchronize()
            timing = f"eager x{calls} (no capture: {type(e).__name__})"
        finally:
            del graph
    if dev_ms is None:
        dev_ms = events_ms(lambda: [fn() for _ in range(calls)], reps) / calls
        timing = timing or f"eager x{calls}"
    return {"dev_us": dev_ms * 1e3, "host_us": host_us(fn, max(calls, 5), torch.device("cuda")), "timing": timing}


def measure_cpu(fn: Callable[[], object], reps: int) -> dict:
    us = wall_ms(fn, 1, reps) * 1e3
    return {"dev_us": us, "host_us": us, "timing": "cpu wall"}


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


def peak_bandwidth(dev: torch.device, reps: int) -> tuple[float, int]:
    """Bytes read + written per second of a large device-to-device copy (1 GiB on a GPU)."""
    nbytes = (1 << 30) if dev.type == "cuda" else (64 << 20)
    src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if dev.type == "cuda":
        seconds = events_ms(lambda: dst.copy_(src), max(5, reps)) / 1e3
    else:
        seconds = wall_ms(lambda: dst.copy_(src), 1, max(3, reps)) / 1e3
    return 2 * nbytes / seconds, nbytes


def row(s: Setup, case: str, shape: str, specd: dict, baseline: str, base: Optional[dict], check: str,
        nbytes: float = 0.0, bound_note: str = "") -> dict:
    """One table row: specd's op (device, host us), its bound, and the baseline's times."""
    bound = s.bound_us(nbytes)
    out = {"case": case, "shape": shape, "specd_dev_us": round(specd["dev_us"], 2),
           "specd_host_us": round(specd["host_us"], 2), "timing": specd["timing"],
           "bound_us": round(bound, 2) if bound else None, "bound_bytes": int(nbytes) or None,
           "bandwidth_share": round(bound / specd["dev_us"], 3) if bound else None, "bound_note": bound_note or None,
           "baseline": baseline, "check": check}
    if base is not None:
        out.update(baseline_dev_us=round(base["dev_us"], 2), baseline_host_us=round(base["host_us"], 2),
                   baseline_timing=base["timing"],
                   speedup=round(base["dev_us"] / specd["dev_us"], 2) if specd["dev_us"] else None)
    return out


def dname(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def esize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


SAMPLING_MODES = {  # (temperature, top_k, top_p) of the rows, in turn
    "greedy": [(0.0, 0, 1.0)],
    "temperature 0.8": [(0.8, 0, 1.0)],
    "top-k 50": [(0.7, 50, 1.0)],
    "top-p 0.9": [(1.0, 0, 0.9)],
    "mixed": [(0.0, 0, 1.0), (0.8, 0, 1.0), (0.7, 50, 1.0), (1.0, 0, 0.9)],
}


def bench_sampling(s: Setup) -> list[dict]:
    import specd.ops as ops
    from specd.engine.params import SamplingParams
    from torch_row_sampling import RowParams, row_sampling_probs, sample_rows
    from torch_row_sampling import row_loop_sampling_probs

    dev, n = s.dev, s.batch
    g = torch.Generator(device=dev).manual_seed(0)
    logits32 = torch.randn(n, s.vocab, device=dev, generator=g) * 4
    keys = ops.pack_rng_keys(torch.tensor(7, device=dev), torch.arange(n, device=dev), torch.tensor(1, device=dev),
                             torch.arange(n, device=dev))
    positions = torch.arange(n, device=dev)
    dtypes = (torch.bfloat16, torch.float32) if s.cuda else (torch.float32,)
    out = []
    for mode, kinds in SAMPLING_MODES.items():
        temp, top_k, top_p = (torch.tensor([kinds[i % len(kinds)][j] for i in range(n)], device=dev)
                              for j in range(3))
        params = ops.pack_sampling_params(temp, top_k, top_p, torch.zeros(n, device=dev))
        rp = RowParams(greedy=temp == 0, temperature=torch.where(temp == 0, 1.0, temp).double(), top_k=top_k.long(),
                       top_p=top_p.double(), min_p=torch.zeros(n, dtype=torch.float64, device=dev),
                       seed_lo=torch.full((n,), 7, device=dev), seed_hi=torch.zeros(n, dtype=torch.int64, device=dev),
                       request=torch.arange(n, device=dev))
        for dtype in dtypes:
            logits = logits32.to(dtype)
            tokens, status = ops.sample_tokens(logits, params, keys)
            probs, _ = ops.sampling_probs(logits, params, False, None)
            ref = row_sampling_probs(logits.float(), rp)
            greedy_ok = torch.equal(tokens[temp == 0].long(), logits.float()[temp == 0].argmax(-1))
            err = float((probs.double() - ref).abs().max())
            check = f"status ok={not bool(status.any())}, greedy equal={greedy_ok}, probs max|diff|={err:.1e}"
            shape = f"{n} x {s.vocab} {dname(dtype)}, {mode}"
            read = n * s.vocab * esize(dtype)
            specd = s.measure(lambda: ops.sample_tokens(logits, params, keys))
            base = s.measure(lambda: sample_rows(logits, rp, 1, positions))
            out.append(row(s, "sample_tokens", shape, specd, "torch batched rows", base, check, read,
                           "one read of the logits"))
            print(f"  sampling {shape}: {specd['dev_us']:.1f} us", flush=True)
            # A thread-block cluster per row (sm_90+) against the one-block kernel above.
            c_tokens, c_status = ops.sample_tokens(logits, params, keys, cluster=True)
            clustered = s.measure(lambda: ops.sample_tokens(logits, params, keys, cluster=True))
            out.append(row(s, "sample_tokens cluster", shape, clustered, "one block per row", specd,
                           f"tokens equal={torch.equal(c_tokens, tokens)}, statuses equal="
                           f"{torch.equal(c_status, status)}", read, "one read of the logits"))
            if mode != "greedy":
                # The Gumbel-max draw (DrawRule::kGumbelMax) against the inverse-CDF draw, both
                # clustered: another rule (other tokens), the same statuses, tokens the CPU's.
                g_tokens, g_status = ops.sample_tokens(logits, params, keys, cluster=True, gumbel=True)
                cpu_tokens, _ = ops.sample_tokens(logits.cpu(), params.cpu(), keys.cpu(), gumbel=True)
                gumbel = s.measure(lambda: ops.sample_tokens(logits, params, keys, cluster=True, gumbel=True))
                out.append(row(s, "sample_tokens cluster gumbel", shape, gumbel, "cluster, inverse-CDF draw",
                               clustered, f"statuses equal={torch.equal(g_status, c_status)}, tokens equal the CPU's="
                               f"{torch.equal(g_tokens.cpu(), cpu_tokens)}", read, "one read of the logits"))
            if mode == "mixed":
                out.append(row(s, "sampling_probs", shape, s.measure(lambda: ops.sampling_probs(logits, params, False, None)),
                               "torch batched rows", s.measure(lambda: row_sampling_probs(logits, rp)), check,
                               read + n * s.vocab * 4, "logits read + fp32 probs written"))
                if dtype == torch.float32:
                    py_params = [SamplingParams(temperature=float(t), top_k=int(k), top_p=float(p)) for t, k, p in
                                 zip(temp.tolist(), top_k.tolist(), top_p.tolist())]
                    base = s.wall(lambda: [row_loop_sampling_probs(logits[r], p) for r, p in enumerate(py_params)],
                                  max(3, s.reps // 4))
                    out.append(row(s, "sample_tokens", shape, specd, "torch per-row loop", base,
                                   "the draft-tree loop's per-row path (before 2026-11-27)", read, "one read of the logits"))
    # The draft loop's sampling, by batch: one kernel for tokens + distributions vs the torch rows.
    for rows_n in sorted({1, min(8, n), n}):
        for mode in ("temperature 0.8", "top-p 0.9"):
            (t0, k0, p0), = SAMPLING_MODES[mode]
            temp = torch.full((rows_n,), t0, device=dev)
            params = ops.pack_sampling_params(temp, torch.full((rows_n,), k0, device=dev),
                                              torch.full((rows_n,), p0, device=dev), torch.zeros(rows_n, device=dev))
            rp = RowParams(greedy=temp == 0, temperature=temp.double(), top_k=torch.full((rows_n,), k0, device=dev),
                           top_p=torch.full((rows_n,), p0, dtype=torch.float64, device=dev),
                           min_p=torch.zeros(rows_n, dtype=torch.float64, device=dev),
                           seed_lo=torch.full((rows_n,), 7, device=dev),
                           seed_hi=torch.zeros(rows_n, dtype=torch.int64, device=dev),
                           request=torch.arange(rows_n, device=dev))
            logits = logits32[:rows_n].to(torch.bfloat16)
            k_rows = keys[:rows_n].contiguous()
            tokens, probs, status = ops.sample_tokens_and_probs(logits, params, k_rows)
            want, _ = ops.sampling_probs(logits, params, False, None)
            check = f"status ok={not bool(status.any())}, probs equal sampling_probs={torch.equal(probs, want)}"
            shape = f"{rows_n} x {s.vocab} bf16, {mode}"
            specd = s.measure(lambda: ops.sample_tokens_and_probs(logits, params, k_rows))
            base = s.measure(lambda: sample_rows(logits, rp, 1, positions[:rows_n]))
            out.append(row(s, "sample_tokens_and_probs", shape, specd, "torch batched rows", base, check,
                           rows_n * s.vocab * (esize(torch.bfloat16) + 4), "logits read + fp32 probs written"))
            print(f"  draft sampling {shape}: {specd['dev_us']:.1f} us", flush=True)
            # The draft graph's form: the rows written into its buffer, against the functional
            # op plus the copy the graph made before.
            buf = torch.empty_like(probs)
            into = s.measure(lambda: ops.sample_tokens_and_probs_out(logits, params, k_rows, buf, False, False, None))
            then_copy = s.measure(lambda: buf.copy_(ops.sample_tokens_and_probs(logits, params, k_rows)[1]))
            ops.sample_tokens_and_probs_out(logits, params, k_rows, buf, False, False, None)
            out.append(row(s, "sample_tokens_and_probs_out", shape, into, "functional op + copy into the buffer",
                           then_copy, f"rows equal the functional op's={torch.equal(buf, probs)}",
                           rows_n * s.vocab * (esize(torch.bfloat16) + 4), "logits read + fp32 probs written"))
            c_tokens, c_probs, _ = ops.sample_tokens_and_probs(logits, params, k_rows, cluster=True)
            clustered = s.measure(lambda: ops.sample_tokens_and_probs(logits, params, k_rows, cluster=True))
            diff = float((c_probs - probs).abs().max())
            out.append(row(s, "sample_tokens_and_probs cluster", shape, clustered, "one block per row", specd,
                           f"tokens equal={torch.equal(c_tokens, tokens)}, probs max|diff|={diff:.1e}",
                           rows_n * s.vocab * (esize(torch.bfloat16) + 4), "logits read + fp32 probs written"))
            # The Gumbel-max draw from the written rows (KernelChoice(draw="gumbel") of a draft).
            g_tokens, g_probs, g_status = ops.sample_tokens_and_probs(logits, params, k_rows, cluster=True, gumbel=True)
            gumbel = s.measure(lambda: ops.sample_tokens_and_probs(logits, params, k_rows, cluster=True, gumbel=True))
            kept = bool((g_probs.gather(1, g_tokens.long()[:, None]) > 0).all())
            out.append(row(s, "sample_tokens_and_probs cluster gumbel", shape, gumbel, "cluster, inverse-CDF draw",
                           clustered, f"rows equal={torch.equal(g_probs, c_probs)}, statuses ok="
                           f"{not bool(g_status.any())}, tokens kept={kept}",
                           rows_n * s.vocab * (esize(torch.bfloat16) + 4), "logits read + fp32 probs written"))
    return out


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

    def host_greedy_from_tokens():
        host = target_tokens.cpu()
        return [verify_greedy_tokens(host[r * width:(r + 1) * width], trees[r]) for r in range(n)]

    target_tokens = logits.argmax(-1).int()
    logits16 = logits.to(torch.bfloat16) if s.cuda else logits
    got_g = ops.verify_greedy(offsets, parents, tokens, logits, width)
    got_g16 = ops.verify_greedy(offsets, parents, tokens, logits16, width)
    got_t = ops.verify_greedy_tokens(offsets, parents, tokens, target_tokens, width)
    got_s = ops.verify_stochastic(offsets, parents, tokens, target_probs, draft_probs, keys, "without_replacement",
                                  width)
    want_g, want_s = host_greedy(), host_stochastic()
    want_accepted = [o.num_accepted for o in want_g]
    same_g = got_g[2].tolist() == want_accepted
    same_t = got_t[2].tolist() == want_accepted and all(
        got_t[0][r, :o.num_accepted + 1].tolist() == list(o.tokens) for r, o in enumerate(want_g))
    # bf16 rows may round two near-equal logits together: compare with the argmax of the rounded rows
    want16 = ops.verify_greedy_tokens(offsets.cpu(), parents.cpu(), tokens.cpu(),
                                      logits16.float().argmax(-1).int().cpu(), width)
    same_g16 = torch.equal(got_g16[0].cpu(), want16[0])
    same_s = got_s[2].tolist() == [o.num_accepted for o in want_s] and all(
        got_s[0][r, :o.num_accepted + 1].tolist() == list(o.tokens) for r, o in enumerate(want_s))
    shape = f"{n} x k {s.k} x {s.vocab}"
    rows_read = nodes * s.vocab
    out, host_path = [], s.wall(host_greedy)
    variants = [(logits, f"equal to host={same_g}", "fp32")]
    if s.cuda:
        variants.append((logits16, f"equal to the CPU op on the bf16 rows' argmax={same_g16}", "bf16"))
    for rows_t, check, name in variants:
        one_block = s.measure(lambda: ops.verify_greedy(offsets, parents, tokens, rows_t, width))
        out.append(row(s, "verify_greedy", f"{shape} {name} logits", one_block,
                       "argmax + host verify (fp32)", host_path, check,
                       rows_read * esize(rows_t.dtype), f"one read of the {nodes} logits rows"))
        # A cluster of 8 blocks per request (sm_90+): one block per request leaves all but n SMs idle.
        same_c = all(torch.equal(a, b) for a, b in zip(
            ops.verify_greedy(offsets, parents, tokens, rows_t, width, cluster=True),
            ops.verify_greedy(offsets, parents, tokens, rows_t, width)))
        out.append(row(s, "verify_greedy cluster", f"{shape} {name} logits",
                       s.measure(lambda: ops.verify_greedy(offsets, parents, tokens, rows_t, width, cluster=True)),
                       "one block per request", one_block, f"outputs equal={same_c}",
                       rows_read * esize(rows_t.dtype), f"one read of the {nodes} logits rows"))
    out.append(row(s, "verify_greedy_tokens", f"{shape}, token ids",
                   s.measure(lambda: ops.verify_greedy_tokens(offsets, parents, tokens, target_tokens, width)),
                   "token ids to host + host verify", s.wall(host_greedy_from_tokens), f"equal to host={same_t}",
                   0, "no bound: a few KB of inputs (launch-bound)"))
    out.append(row(s, "verify_stochastic", f"{shape} fp32 probs",
                   s.measure(lambda: ops.verify_stochastic(offsets, parents, tokens, target_probs, draft_probs, keys,
                                                           "without_replacement", width)),
                   "rows to host + verify", s.wall(host_stochastic, max(3, s.reps // 4)), f"equal to host={same_s}",
                   2 * rows_read * 4, "every node's target + draft row read once"))
    stochastic = lambda cluster: ops.verify_stochastic(offsets, parents, tokens, target_probs,  # noqa: E731
                                                       draft_probs, keys, "without_replacement", width,
                                                       cluster=cluster)
    same_c = all(torch.equal(a, b) for a, b in zip(stochastic(True), stochastic(False)))
    clustered = s.measure(lambda: stochastic(True))
    out.append(row(s, "verify_stochastic cluster", f"{shape} fp32 probs", clustered,
                   "one block per request", s.measure(lambda: stochastic(False)), f"outputs equal={same_c}",
                   2 * rows_read * 4, "every node's target + draft row read once"))
    # With the rows' totals given (what sampling_probs / the draft runner write; here summed by
    # torch): a node whose draft is accepted costs two reads instead of two whole rows.
    t_totals, d_totals = target_probs.double().sum(-1), draft_probs.double().sum(-1)
    with_totals = lambda: ops.verify_stochastic(offsets, parents, tokens, target_probs, draft_probs,  # noqa: E731
                                                keys, "without_replacement", width, cluster=True,
                                                target_totals=t_totals, draft_totals=d_totals)
    same_t = all(torch.equal(a, b) for a, b in zip(with_totals(), stochastic(True)))
    out.append(row(s, "verify_stochastic cluster, row totals", f"{shape} fp32 probs", s.measure(with_totals),
                   "cluster, rows summed by the walk", clustered,
                   f"outputs equal={same_t} (totals summed by torch: another order of additions)",
                   0, "no fixed bound: what it reads depends on the acceptances"))
    # From the target's logits (verify_stochastic_logits): the step's whole sampled verification
    # (temperature 1, the draft rows' totals given) against sampling_probs writing every node's
    # row and total, then the verification above; both with a cluster per row / request.
    params = ops.pack_sampling_params(torch.ones(nodes, dtype=torch.float64, device=dev),
                                      torch.zeros(nodes, dtype=torch.int64, device=dev),
                                      torch.ones(nodes, dtype=torch.float64, device=dev),
                                      torch.zeros(nodes, dtype=torch.float64, device=dev))
    p_totals = torch.empty(nodes, dtype=torch.float64, device=dev)

    def rows_then_verify():
        probs, _ = ops.sampling_probs(logits16, params, True, p_totals)
        return ops.verify_stochastic(offsets, parents, tokens, probs, draft_probs, keys, "without_replacement", width,
                                     cluster=True, target_totals=p_totals, draft_totals=d_totals)

    from_logits = lambda: ops.verify_stochastic_logits(offsets, parents, tokens, logits16,  # noqa: E731
                                                       params[:n], draft_probs, keys, "without_replacement", width,
                                                       cluster=True, draft_totals=d_totals)
    same_l = all(torch.equal(a, b) for a, b in zip(from_logits(), rows_then_verify()))
    out.append(row(s, "verify_stochastic_logits cluster", f"{shape} {'bf16' if s.cuda else 'fp32'} logits",
                   s.measure(from_logits), "sampling_probs + verify_stochastic (cluster, totals)",
                   s.measure(rows_then_verify), f"outputs equal={same_l}",
                   0, "no fixed bound: the visited nodes' logits rows, planned in the walk"))
    return out


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
        moved = 2 * 2 * tokens * k[0].numel() * esize(s.dtype)  # K and V rows, read + written
        out.append(row(s, "kv_write", f"{tokens} tok, 2x128 {dname(s.dtype)}",
                       s.measure(lambda: ops.kv_write(layers[0].k, layers[0].v, k, v, slots)),
                       "torch index_put", s.measure(lambda: write_kv(layer_b, k, v, slots)), check, moved,
                       "new K/V rows read + written"))
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
    moved = 2 * n * 5 * s.layers * 2 * storage[0, 0, 0, 0].numel() * esize(s.dtype)  # rows read + written
    return [row(s, "kv_compact", f"{n} req x {s.layers} layers, 5 moves",
                s.measure(lambda: ops.kv_compact(k5, v5, table, tree_start, path, accepted)),
                "torch gather/scatter per layer", s.measure(torch_path), check, moved,
                "moved K/V rows read + written")]


def bench_tree_attention(s: Setup) -> list[dict]:
    """Per (batch, history): the per-head kernel (kv_write + op) against the torch path, then
    the attention alone: the split, head-grouped kernel against the per-head one (same
    inputs; batch 1 with long histories is where the split matters)."""
    import specd.ops as ops
    from specd.models.attention import AttentionMetadata, TorchPagedAttention

    dev, bs, nodes = s.dev, 16, s.k + 1
    g = torch.Generator(device=dev).manual_seed(4)
    out = []
    shapes = [(s.batch, h) for h in s.histories] + [(1, h) for h in s.long_histories]
    for n, history in shapes:
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
        shape = f"{n} req x ({history} + {nodes}), 12/2 heads x 128 {dname(s.dtype)}"
        e = esize(s.dtype)
        kv_bytes = n * (history + nodes) * k[0].numel() * 2 * e  # K/V read once (GQA groups share it)
        ops.kv_write(cache.k, cache.v, k, v, slot_map)

        def attend(grouped: bool):
            return ops.tree_attention(q, cache.k, cache.v, table, starts, kv_lens, grouped=grouped)

        if n == s.batch:  # the engine's baseline: TorchPagedAttention (write + per-sequence SDPA)
            meta = AttentionMetadata(query_start=starts.tolist(), kv_lens=kv_lens.tolist(),
                                     block_tables=table.long(), slot_mapping=slot_map, positions=pos.repeat(n),
                                     masks=[None] * n)
            torch_backend = TorchPagedAttention()

            def specd_path():
                ops.kv_write(cache.k, cache.v, k, v, slot_map)
                return attend(False)

            want, got = torch_backend.forward(q, k, v, cache, meta, None), specd_path()
            rel = float((got.float() - want.float()).norm() / want.float().norm())
            out.append(row(s, "tree_attention", shape, s.measure(specd_path), "TorchPagedAttention (write + SDPA)",
                           s.measure(lambda: torch_backend.forward(q, k, v, cache, meta, None)),
                           f"rel err={rel:.1e}", kv_bytes + 2 * q.numel() * e + 2 * 2 * k.numel() * e,
                           "KV read once + q, out, new K/V"))
        per_head, grouped = attend(False), attend(True)
        rel = float((grouped.float() - per_head.float()).norm() / per_head.float().norm())
        out.append(row(s, "tree_attention grouped", shape, s.measure(lambda: attend(True)),
                       "per-head kernel (attention only)", s.measure(lambda: attend(False)),
                       f"rel diff={rel:.1e}", kv_bytes + 2 * q.numel() * e, "KV read once + q, out"))
    return out


BENCHES = {"sampling": bench_sampling, "verification": bench_verification, "kv_write": bench_kv_write,
           "kv_compact": bench_kv_compact, "tree_attention": bench_tree_attention}


def fmt(x: Optional[float], width: int, digits: int = 1) -> str:
    return f"{x:>{width}.{digits}f}" if x is not None else f"{'-':>{width}}"


def print_table(rows: list[dict]) -> None:
    print("dev us: device time per call (CUDA graph of back-to-back calls, else eager under events: see timing);"
          " host us: host time per call; bound us: bytes / measured copy bandwidth; bw %: bound / dev")
    print(f"{'case':<31} {'shape':<44} {'dev us':>9} {'host us':>8} {'bound us':>9} {'bw %':>5} "
          f"{'base dev':>10} {'base host':>9} {'x':>6}  timing | baseline (timing) / check")
    for r in rows:
        share = 100 * r["bandwidth_share"] if r.get("bandwidth_share") else None
        print(f"{r['case']:<31} {r['shape']:<44} {fmt(r['specd_dev_us'], 9)} {fmt(r['specd_host_us'], 8)} "
              f"{fmt(r['bound_us'], 9)} {fmt(share, 5, 0)} {fmt(r.get('baseline_dev_us'), 10)} "
              f"{fmt(r.get('baseline_host_us'), 9)} {fmt(r.get('speedup'), 6, 2)}  {r['timing']} | "
              f"{r['baseline']} ({r.get('baseline_timing', '-')}) / {r['check']}")


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
    reps = 5 if args.quick else 15
    print(f"specd {_core.__version__}: CUDA kernels built={ops.HAS_CUDA_KERNELS}, torch {torch.__version__}, "
          f"cuda available={torch.cuda.is_available()}")
    print(f"plan: {', '.join(cases)}; {reps} repetitions (median) of CUDA-graph replays of up to {MAX_CALLS} calls "
          f"(device time) and of {MAX_CALLS}-call eager batches (host time); peak bandwidth from a 1 GiB copy; "
          f"JSON -> {args.out}/bench_kernels.json")
    if args.dry_run:
        missing = [n for n in ("kv_write_cuda", "tree_attention_cuda", "sample_tokens_batch_cuda",
                               "verify_stochastic_batch_cuda", "verify_stochastic_logits_batch_cuda")
                   if not hasattr(_core, n)]
        print("dry run: imports ok" + (f"; this _core lacks {missing} (built without CUDA)" if missing else ""))
        return 0
    if args.smoke_cpu:
        setup = Setup(torch.device("cpu"), 2, **SMOKE)
    elif not torch.cuda.is_available() or not ops.HAS_CUDA_KERNELS:
        print("needs a CUDA device and a specd build with CUDA kernels (or --smoke-cpu)", file=sys.stderr)
        return 2
    else:
        setup = Setup(torch.device("cuda"), reps)
    bandwidth, copied = peak_bandwidth(setup.dev, setup.reps)
    setup = dataclasses.replace(setup, bandwidth=bandwidth)
    print(f"peak bandwidth (copy_ of {copied >> 20} MiB, read + written): {bandwidth / 1e9:.0f} GB/s", flush=True)
    rows, errors = [], {}
    for name in cases:
        t0 = time.perf_counter()
        try:
            rows += BENCHES[name](setup)
            print(f"[{name}] measured in {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as e:  # one broken case must not hide the others' numbers
            errors[name] = f"{type(e).__name__}: {e}"
            print(f"[{name}] FAILED: {errors[name]}", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name() if setup.dev.type == "cuda" else "cpu (smoke)",
            "torch": torch.__version__, "reps": setup.reps, "max_calls_per_graph": MAX_CALLS,
            "peak_bandwidth_GBps": round(bandwidth / 1e9, 1), "bandwidth_copy_bytes": copied}
    with open(os.path.join(args.out, "bench_kernels.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "errors": errors}, f, indent=1)
    print_table(rows)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
