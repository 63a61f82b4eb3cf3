"""Host-side overhead of the draft model's k-step loop on the lent GPU: the plain eager loop
(run_draft, torch attention) against the draft graph runner (engine/draft_graph.py) eager,
captured as one CUDA graph per call ("one graph") and as one graph per forward (the default,
"CUDA graph"), and with the target's verify steps captured too (target_graph.py), through the
whole engine: with the drafts read on the host between the draft call and the verify forward
("draft + target graphs") or kept on the device until the verify forward is queued ("drafts
kept on device", Engine.device_drafts: the default with both runners; there the draft-call
probes below wrap model_runner.run_draft_on_device, the draft call without the drafts' read,
which the engine does later with the verification results).

    python bench/gpu/bench_draft_loop.py [--quick] [--budget-s S] [--out DIR] [--torch-layers]
                                         [--kernels FIELD=VALUE,...] [--tree-width W] [--temperature T]
                                         [--dry-run] [--smoke-cpu]

--temperature T (> 0): sampled requests, seeded (every run draws the same tokens), instead of
greedy ones: the draft's rows and stochastic verification (with the rows' totals and the
draft rows read in the runner's buffers) are then part of every step. The plain-decoding
comparison of the target-graph modes is greedy only (skipped).

--tree-width W (2..8): draft-model trees of width W instead of chains, in three modes: the host
loop (draft_tree.run_draft_tree: a host read per forward), the tree runner eager and the tree
runner captured (engine/draft_tree_graph.py: one read per call); the probes wrap
run_draft_tree and the runner's run (its call, without the record's host read).

Models: random-weight Llama-family models with the shapes of the real pair (target like
Qwen2.5-Coder-1.5B: 28 layers, hidden 1536; draft like 0.5B: 24 layers, hidden 896, 14/2
heads; vocab 151,936), bf16, built in memory (no download; acceptance is meaningless, timing
is not). Plan: batch 1 and 8, k 4, 24 greedy tokens (--quick: 12 tokens); for each case, one
LLM per (mode, layers) generates the same requests after a warm-up run (which also captures the
graphs). layers: "fused" (the default on CUDA: nine kernels per decoder layer, specd.ops layer
ops) or "torch" (about forty torch kernels per layer, LLM(fused_layers=False)); with
--torch-layers the graph modes run both, else every mode runs the default only. --kernels:
the specd.KernelChoice of both models (e.g. grouped_attention=true: the split, head-grouped
attention kernel in every kernel-attention forward; default KernelChoice(); recorded in the
JSON's meta).

Per row (printed as soon as measured; bench_draft_loop.json rewritten after every row):
  draft ms/fwd   the engine's timer: draft time / draft forwards (forward 0, the catch-up,
                 included; the engine synchronises around every forward, graph mode times the
                 whole replay in its first forward)
  wall us/step   a probe around the engine's draft calls (model_runner.run_draft, patched in
                 this script only): the same call re-run with a synchronisation before and after
                 and no engine timer, wall clock / draft forwards (k per call)
  gpu us/step    the same call once more under torch.profiler (CUDA activity): the union of the
                 device intervals of its kernels and copies / draft forwards, i.e. the GPU time
                 of that work without the gaps the host leaves
  kernels/fwd    the GPU kernels of that profiled call / draft forwards (what the graph's launch
                 and its per-kernel gaps scale with)
  host us/step   wall - gpu: everything per draft step that is not GPU work (Python, launches,
                 host synchronisations, and the device-side gaps between kernels). Medians over
                 up to 6 draft calls per run (the first call of a run, which catches the draft up
                 on the prompts, skipped). It splits into:
  device us/step graph modes: the call re-run once more, the GPU first kept busy (a ~5 ms
                 sleep kernel) while the host packs, uploads and launches; CUDA events
                 recorded around the runner's call then time its device work alone (upload,
                 graphs, the GPU's own gaps between nodes), none of the host's time in it
  exposed host   wall - device: host time the GPU waits for (input packing, upload, launch
                 latency, the drafts copied to the host, Python around them)
  device gaps    device - gpu: idle time between the call's device operations (inside a CUDA
                 graph: the GPU scheduling the next node)
  loop host us/step  graph modes only: host time of the graph runner's call inside the
                 probe's wall-clock re-run (inputs packed and copied, graph replayed or loop
                 launched; no synchronisation in it) / the draft forwards it runs (k when
                 forward 0, the catch-up, runs in the runner; k - 1 when forward 0 ran eagerly
                 before it): the host-side overhead per draft step of the device-side loop
  fill us/step, launch us/step  of that host time: packing and uploading the inputs
                 (DraftGraphRunner._fill) and the graph launches (CUDAGraph.replay calls)
  target ms/step, step ms: the engine's target forward time and whole step time per step
                 (the last two modes also run verify steps through the target graph runner)
  gpu idle us/step  the captured modes on CUDA: the timed run's wall time minus the GPU busy
                 time of one more run of the same requests under the profiler, per engine step:
                 what the GPU waits for the host per step, prefill steps included (the engine-
                 level counterpart of "exposed host"; compare "draft + target graphs" with
                 "drafts kept on device")
  draft share, tok/s, same: the draft's share of step time, generated tokens per second, and
                 whether the outputs equal those of the case's first mode with the same layers
                 (greedy speculation is lossless, so every mode must produce the same tokens; fused
                 and torch layers round differently in bf16; the target-graph modes
                 verify with the attention kernels while the others verify with torch SDPA,
                 so in bf16 they are also compared with plain decoding through the target graph,
                 i.e. with the same attention numerics).
Re-running a draft call is harmless: it writes the same KV rows with the same values and
returns the same drafts. --budget-s (default 120): cases not started by then (or predicted to
end after it) are skipped and listed as skipped. --smoke-cpu: tiny float32 models on the CPU,
no CUDA-graph mode and no profiler (times nothing meaningful).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from typing import Optional

import torch

MODES = ("eager loop", "graph runner, eager", "graph runner, one graph", "graph runner, CUDA graph",
         "draft + target graphs", "drafts kept on device")
# --tree-width W > 1: draft-model trees, grown by the host loop (a host read per forward) or on
# the device by the tree runner (engine/draft_tree_graph.py), eager or captured.
TREE_MODES = ("tree host loop", "tree runner, eager", "tree runner, CUDA graph")
GRAPH_MODES = (MODES[2], MODES[3], MODES[4], MODES[5], TREE_MODES[2])  # with --torch-layers: run with both layer kinds
PROBE_CALLS = 6  # draft calls probed per run (after the first)
# Modes whose engine steps are also profiled for the GPU's idle time per step (CUDA only).
STEP_IDLE_MODES = (MODES[3], MODES[4], MODES[5])
SLEEP_CYCLES = 10_000_000  # ~5 ms of GPU clock: longer than a draft call's host work


def configs(smoke: bool = False):
    """(target, draft) ModelConfigs shaped like the real pair (tiny ones for --smoke-cpu)."""
    from specd.models.config import ModelConfig

    common = dict(architecture="qwen2", vocab_size=1000 if smoke else 151_936, rope_theta=1e6, rms_norm_eps=1e-6,
                  max_position_embeddings=4096, tie_word_embeddings=False, attention_bias=True, eos_token_ids=(0,))
    if smoke:
        small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16)
        return ModelConfig(**small, **common), ModelConfig(**small, **common)
    target = ModelConfig(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, head_dim=128, **common)
    draft = ModelConfig(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                        num_key_value_heads=2, head_dim=64, **common)
    return target, draft


def device_and_dtype(smoke: bool) -> Optional[tuple[str, torch.dtype]]:
    """("cpu", float32) for a smoke run, ("cuda", bfloat16) where specd's CUDA kernels can run,
    else None (with the reason printed)."""
    import specd.ops as ops

    if smoke:
        return "cpu", torch.float32
    if not torch.cuda.is_available() or not ops.HAS_CUDA_KERNELS:
        print("needs a CUDA device and a specd build with CUDA kernels (or --smoke-cpu)", file=sys.stderr)
        return None
    return "cuda", torch.bfloat16


def random_model(config, dev, dtype):
    from specd.models.llama import LlamaModel

    with torch.device(dev):
        model = LlamaModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.02 * torch.randn_like(p))
    return model.to(dtype).eval()


def gpu_busy_us(fn) -> tuple[Optional[float], int]:
    """Microseconds the GPU spends in fn's kernels and copies (union of their intervals, from
    torch.profiler's CUDA activity; None when the profiler records no device activity) and the
    number of kernels among them."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start]
    kernels = sum(1 for e in events if "memcpy" not in e.name.lower() and "memset" not in e.name.lower())
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    if not spans:
        return None, 0
    busy, (start, end) = 0.0, spans[0]
    for s, e in spans[1:]:
        if s > end:
            busy += end - start
            start, end = s, e
        else:
            end = max(end, e)
    return busy + end - start, kernels


class DraftProbe:
    """Wraps model_runner.run_draft while enabled: for up to PROBE_CALLS calls (after skipping
    the first), re-runs the call without the engine's timer (synchronised wall clock) and under
    the profiler (GPU busy time), then runs it for the engine as usual (module doc)."""

    def __init__(self, real, cuda: bool, loop_probe: Optional["RunnerProbe"] = None):
        self.real, self.cuda, self.loop_probe = real, cuda, loop_probe
        self.enabled, self.seen, self.samples, self.errors = False, 0, [], []

    def reset(self, enabled: bool) -> None:
        self.enabled, self.seen, self.samples = enabled, 0, []

    def __call__(self, model, pool, items, on_forward=None, graph=None, **options):
        return self._probe(items, lambda timed: self.real(model, pool, items, timed, graph, **options), on_forward)

    def _probe(self, items, call, on_forward):
        """``call(on_forward)`` makes the draft call of ``items``."""
        if self.enabled and self.seen > 0 and len(self.samples) < PROBE_CALLS:
            forwards = max(it.k for it in items)
            run = lambda: call(None)  # noqa: E731
            if self.cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            if self.loop_probe is not None:
                self.loop_probe.enabled = True
            ran = run() is not None  # (run_draft_on_device: None when the runner does not take the call)
            if self.loop_probe is not None:
                self.loop_probe.enabled = False
            if self.cuda:
                torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) * 1e6
            if not ran:
                self.seen += 1
                return call(on_forward)
            gpu, kernels, device = None, None, None
            if self.cuda:
                try:
                    gpu, kernels = gpu_busy_us(run)
                except Exception as e:  # keep the wall-clock numbers
                    self.errors.append(f"profiler: {type(e).__name__}: {e}")
                if self.loop_probe is not None:  # the runner's device time, its host work hidden
                    self.loop_probe.measure_device = True
                    run()
                    self.loop_probe.measure_device = False
                    device = self.loop_probe.device_us(forwards)
            self.samples.append({"forwards": forwards, "batch": len(items), "wall_us": wall, "gpu_us": gpu,
                                 "device_us": device, "kernels": kernels})
        self.seen += 1
        return call(on_forward)

    def summary(self) -> dict:
        per = lambda key: [s[key] / s["forwards"] for s in self.samples if s[key] is not None]  # noqa: E731
        wall, gpu, kernels = per("wall_us"), per("gpu_us"), per("kernels")
        host = [(s["wall_us"] - s["gpu_us"]) / s["forwards"] for s in self.samples if s["gpu_us"] is not None]
        # wall - device: the host time the GPU waits for; device - busy: device-side gaps
        # between the call's operations (module doc)
        timed = [s for s in self.samples if s["device_us"] is not None and s["gpu_us"] is not None]
        exposed = [(s["wall_us"] - s["device_us"]) / s["forwards"] for s in timed]
        gaps = [(s["device_us"] - s["gpu_us"]) / s["forwards"] for s in timed]
        device = [s["device_us"] / s["forwards"] for s in timed]
        med = lambda xs: round(statistics.median(xs), 1) if xs else None  # noqa: E731
        return {"probe_calls": len(self.samples), "wall_us_per_step": med(wall), "gpu_us_per_step": med(gpu),
                "host_us_per_step": med(host), "device_us_per_step": med(device),
                "exposed_host_us_per_step": med(exposed),
                "device_gap_us_per_step": med(gaps), "kernels_per_forward": med(kernels)}


class TreeProbe(DraftProbe):
    """DraftProbe around draft_tree.run_draft_tree (the engine's draft-model tree calls)."""

    def __call__(self, model, pool, items, width, on_forward=None, size=None, graph=None, **options):
        return self._probe(items, lambda timed: self.real(model, pool, items, width, timed, size, graph, **options),
                           on_forward)


class RunnerProbe:
    """Wraps DraftGraphRunner.run: host microseconds of the calls made inside DraftProbe's
    wall-clock re-run (no engine timer, no synchronisation inside the call), per draft
    forward the call runs (k with forward 0 in the runner, else k - 1)."""

    def __init__(self, real):
        self.real, self.enabled, self.samples = real, False, []
        self.real_fill, self.real_replay = None, None
        self.fill_us = self.replay_us = 0.0  # inside the current probed call
        self.replays = 0
        self.measure_device = False  # time the next call's device work (device_us)
        self.device_events = None    # (start, end, forwards run) of that call

    def reset(self, enabled: bool) -> None:
        self.enabled, self.samples = enabled, []

    def install(self, cls) -> None:
        """Wraps the runner's call (cls.run: neither runner reads its results to the host in
        it), cls._fill and torch.cuda.CUDAGraph.replay (this script only)."""
        probe = self
        self.real_fill, self.real_replay = cls._fill, torch.cuda.CUDAGraph.replay

        def run(runner, items, first_tokens=None, on_forward=None):
            probe.fill_us = probe.replay_us = 0.0
            probe.replays = 0
            steps = max(it.k for it in items) - (0 if first_tokens is None else 1)
            if probe.measure_device and runner.capture:  # (eager: the launches would outlast the sleep)
                # The GPU sleeps while the host packs and launches, so the events bracket the
                # call's device work (upload, graphs) with none of the host's time in it.
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(SLEEP_CYCLES)
                start.record()
                out = probe.real(runner, items, first_tokens, on_forward)
                end.record()
                probe.device_events = (start, end, steps)
                return out
            t0 = time.perf_counter()
            out = probe.real(runner, items, first_tokens, on_forward)
            if probe.enabled:
                probe.samples.append(((time.perf_counter() - t0) * 1e6, steps, probe.fill_us, probe.replay_us,
                                      probe.replays))
            return out

        def fill(runner, inp, items):
            t0 = time.perf_counter()
            probe.real_fill(runner, inp, items)
            probe.fill_us += (time.perf_counter() - t0) * 1e6

        def replay(graph):
            t0 = time.perf_counter()
            probe.real_replay(graph)
            probe.replay_us += (time.perf_counter() - t0) * 1e6
            probe.replays += 1

        cls.run = run
        cls._fill, torch.cuda.CUDAGraph.replay = fill, replay

    def device_us(self, forwards: int) -> Optional[float]:
        """Device microseconds of the last call timed with measure_device (synchronises), when
        the runner ran all ``forwards`` forwards of it (else None: forward 0 ran eagerly)."""
        if self.device_events is None:
            return None
        start, end, steps = self.device_events
        self.device_events = None
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 if steps == forwards else None

    def uninstall(self, cls) -> None:
        cls.run = self.real
        cls._fill, torch.cuda.CUDAGraph.replay = self.real_fill, self.real_replay

    def summary(self) -> dict:
        """Per draft step: the runner's host time, and of it the input packing (_fill) and the
        graph launches (CUDAGraph.replay calls); per call: the graphs launched."""
        samples = [s for s in self.samples if s[1] > 0]
        med = lambda xs: round(statistics.median(xs), 1) if xs else None  # noqa: E731
        return {"loop_host_us_per_step": med([s[0] / s[1] for s in samples]),
                "fill_us_per_step": med([s[2] / s[1] for s in samples]),
                "launch_us_per_step": med([s[3] / s[1] for s in samples]),
                "graphs_per_call": med([s[4] for s in samples]), "loop_calls": len(samples)}


def run_mode(mode, layers, target, draft, prompts, batch, k, max_tokens, probe: DraftProbe,
             loop_probe: RunnerProbe, tree_width: int = 1, device_probe: Optional[DraftProbe] = None,
             temperature: float = 0.0):
    import specd
    from specd.engine.draft_graph import DraftGraphRunner

    tree = mode in TREE_MODES
    spec = specd.SpeculationConfig(method="draft", num_speculative_tokens=k,
                                   draft_tree_width=tree_width if tree else 1)
    llm = specd.LLM.from_models(target, draft, spec, device=draft.device, max_num_seqs=batch, max_model_len=2048,
                                num_kv_pages=4096 if draft.device.type == "cuda" else 256,
                                draft_graph=mode not in (MODES[0], TREE_MODES[0]),
                                target_graph=mode in (MODES[4], MODES[5]), fused_layers=layers == "fused")
    # Both runners: the drafts read on the host between the draft call and the verify forward
    # (MODES[4]), or kept on the device until the verify forward is queued (MODES[5]).
    llm.engine.device_drafts = mode == MODES[5]
    if mode in (MODES[1], MODES[2]):  # the runner's loop without capture; one graph for the whole call
        old = llm.draft_graph
        llm.draft_graph = llm.engine.draft_graph = DraftGraphRunner(llm.draft, llm.pool, replace(
            old.config, capture=False if mode == MODES[1] else None, graph_per_forward=mode != MODES[2]))
    if mode == TREE_MODES[1]:  # the tree runner without capture
        from specd.engine.draft_tree_graph import DraftTreeGraphRunner

        old = llm.draft_graph
        llm.draft_graph = llm.engine.draft_graph = DraftTreeGraphRunner(
            llm.draft, llm.pool, replace(old.config, capture=False), tree_width)
    # Seeded when sampled: every run of the same requests draws the same tokens (the same work).
    params = specd.SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True,
                                  seed=11 if temperature > 0 else None)
    probe.reset(False)
    if device_probe is not None:
        device_probe.reset(False)
        if mode == MODES[5]:  # the engine's draft call is run_draft_on_device here
            probe = device_probe
    llm.generate(prompts[:batch], params)  # warm-up (and graph capture)
    llm.engine.timings.reset()
    t0 = time.perf_counter()
    outs = llm.generate(prompts[:batch], params)
    wall = time.perf_counter() - t0
    t = llm.engine.timings
    result = {"mode": mode, "layers": layers, "batch": batch, "k": k, "max_tokens": max_tokens,
              "draft_ms_per_forward": 1e3 * t.draft_forward_s / max(1, t.draft_forwards),
              "draft_forwards": t.draft_forwards, "target_ms_per_step": 1e3 * t.target_forward_s / max(1, t.steps),
              "step_ms": 1e3 * t.step_s / max(1, t.steps), "draft_share": t.draft_forward_s / t.step_s if t.step_s else 0.0,
              "tokens_per_s": sum(len(o.token_ids) for o in outs) / wall}
    if mode in (MODES[4], MODES[5]) and temperature == 0:
        # The verify pass now attends with the kernels, plain decoding with torch SDPA: in bf16
        # their rounding differs. Lossless means equal to plain decoding with the same
        # numerics: plain decoding through the target graph (decode steps are 1-row verifies).
        plain = specd.LLM.from_models(target, None, specd.SpeculationConfig(method="none"), device=target.device,
                                      max_num_seqs=batch, max_model_len=2048,
                                      num_kv_pages=4096 if target.device.type == "cuda" else 256, target_graph=True,
                                      fused_layers=layers == "fused")
        plain_params = replace(params, logprobs=2)  # the top two at each position: how near a tie
        plain_outs = plain.generate(prompts[:batch], plain_params)
        result["same_as_plain_with_kernel_attention"] = [o.token_ids for o in plain_outs] == [o.token_ids for o in outs]
        if not result["same_as_plain_with_kernel_attention"]:
            result["divergences"] = divergences([o.token_ids for o in outs], plain_outs)
        del plain
    if draft.device.type == "cuda" and mode in STEP_IDLE_MODES:
        # One more run under the profiler: the GPU's busy time over the same steps (greedy, so
        # the same work); what the timed run's wall adds to it is the GPU waiting for the host.
        busy, _ = gpu_busy_us(lambda: llm.generate(prompts[:batch], params))
        if busy is not None and t.steps:
            result["gpu_idle_us_per_engine_step"] = (wall * 1e6 - busy) / t.steps
    probe.reset(True)  # a third run, probed (the probe re-runs draft calls: not timed above)
    loop_probe.reset(False)  # enabled by the draft probe around its wall-clock re-runs
    llm.generate(prompts[:batch], params)
    probe.enabled = False
    result.update(probe.summary())
    result.update(loop_probe.summary())
    return result, [o.token_ids for o in outs]


def divergences(spec_tokens: list[list[int]], plain_outs) -> list[dict]:
    """Where each request's speculative tokens first differ from plain decoding's, and the gap
    (nats) between plain decoding's two most likely tokens there (its outputs carry the top two
    logprobs). A gap within the logits' rounding (bfloat16 keeps 8 significant bits) says the
    two runs' numerics, not a rule, chose differently."""
    out = []
    for r, (got, plain) in enumerate(zip(spec_tokens, plain_outs)):
        want = plain.token_ids
        i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if i is None:
            if len(got) != len(want):
                out.append({"request": r, "index": min(len(got), len(want)), "top2_gap": None})
            continue
        top = sorted((lp.logprob for lp in plain.logprobs[i].values()), reverse=True)
        out.append({"request": r, "index": i, "top2_gap": top[0] - top[1] if len(top) > 1 else None})
    return out


def fmt(x, width, digits=1) -> str:
    return f"{x:>{width}.{digits}f}" if isinstance(x, (int, float)) else f"{'-':>{width}}"


HEADER = (f"{'mode':<26} {'layers':>6} {'batch':>5} {'k':>3} {'draft ms/fwd':>12} {'kernels/fwd':>11} "
          f"{'wall us/step':>12} {'gpu us/step':>11} "
          f"{'host us/step':>12} {'device us/step':>14} {'exposed host':>12} {'device gaps':>11} "
          f"{'loop host us/step':>17} "
          f"{'fill us/step':>12} {'launch us/step':>14} "
          f"{'target ms/step':>14} {'step ms':>8} {'gpu idle us/step':>16} {'draft share':>11} "
          f"{'tok/s':>8}  same")


def print_row(r: dict) -> None:
    print(f"{r['mode']:<26} {r['layers']:>6} {r['batch']:>5} {r['k']:>3} {fmt(r['draft_ms_per_forward'], 12, 3)} "
          f"{fmt(r.get('kernels_per_forward'), 11, 0)} "
          f"{fmt(r.get('wall_us_per_step'), 12)} {fmt(r.get('gpu_us_per_step'), 11)} "
          f"{fmt(r.get('host_us_per_step'), 12)} {fmt(r.get('device_us_per_step'), 14)} "
          f"{fmt(r.get('exposed_host_us_per_step'), 12)} "
          f"{fmt(r.get('device_gap_us_per_step'), 11)} {fmt(r.get('loop_host_us_per_step'), 17)} "
          f"{fmt(r.get('fill_us_per_step'), 12)} {fmt(r.get('launch_us_per_step'), 14)} "
          f"{fmt(r['target_ms_per_step'], 14, 2)} {fmt(r['step_ms'], 8, 2)} "
          f"{fmt(r.get('gpu_idle_us_per_engine_step'), 16)} {r['draft_share']:>11.2f} {r['tokens_per_s']:>8.1f}  "
          f"{r['same_outputs_as_first_mode']}"
          + (f" (equal to plain decoding with kernel attention: {r['same_as_plain_with_kernel_attention']})"
             if "same_as_plain_with_kernel_attention" in r else "")
          + "".join(f"; request {d['request']} from token {d['index']}"
                    + (f", plain's top-2 gap there {d['top2_gap']:.4f} nats" if d["top2_gap"] is not None else "")
                    for d in r.get("divergences", [])), flush=True)


def parse_kernels(text: str) -> dict:
    """--kernels "FIELD[=VALUE],..." -> KernelChoice keyword arguments (ValueError if unknown)."""
    from specd.models.kernel_choice import KernelChoice

    values = {"true": True, "false": False, "auto": "auto"}
    out = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in KernelChoice.__dataclass_fields__:
            raise ValueError(f"unknown field {name!r} (KernelChoice has {list(KernelChoice.__dataclass_fields__)})")
        if value.lower() not in values and value:
            raise ValueError(f"{name}={value}: the value must be true, false or auto")
        out[name] = values[value.lower()] if value else True
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="check imports and print the plan (no GPU needed)")
    ap.add_argument("--quick", action="store_true", help="fewer tokens")
    ap.add_argument("--budget-s", type=float, default=120.0,
                    help="skip the cases not started (or predicted to end) within this many seconds")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench-results")
    ap.add_argument("--torch-layers", action="store_true",
                    help="also run the graph modes with torch layers (about forty kernels per layer)")
    ap.add_argument("--kernels", default="",
                    help="comma-separated specd.KernelChoice settings for both models, FIELD=VALUE "
                         "(true, false or, for grouped_attention, auto; a bare FIELD means true), e.g. "
                         "grouped_attention=false,cluster_rows=false; default: KernelChoice()")
    ap.add_argument("--tree-width", type=int, default=1,
                    help="W > 1: time draft-model trees of width W (SpeculationConfig.draft_tree_width) in the "
                         "tree modes instead of chains")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="T > 0: sampled requests (seeded; draft rows, stochastic verification) instead of greedy")
    ap.add_argument("--smoke-cpu", action="store_true",
                    help="tiny float32 models on the CPU, no CUDA graph mode: checks the script, times nothing")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    import specd.ops as ops
    from specd.models.kernel_choice import KernelChoice

    try:
        kernels = KernelChoice(**parse_kernels(args.kernels))
    except ValueError as e:
        ap.error(f"--kernels: {e}")
    from specd.engine import model_runner
    from specd.engine.draft_graph import DraftGraphRunner

    sizes = [(1, 4), (8, 4)]
    max_tokens = 12 if args.quick or args.smoke_cpu else 24
    tree_width = args.tree_width
    if not 1 <= tree_width <= 8:
        ap.error("--tree-width must be in [1, 8]")
    if tree_width > 1:
        modes = TREE_MODES[:2] if args.smoke_cpu else TREE_MODES
    else:
        modes = (MODES[0], MODES[1], MODES[4], MODES[5]) if args.smoke_cpu else MODES
    path = os.path.join(args.out, "bench_draft_loop.json")
    print(f"plan: draft loop, (batch, k) in {sizes}, {max_tokens} tokens, modes {list(modes)}, budget "
          f"{args.budget_s:.0f} s; JSON -> {path}", flush=True)
    target_cfg, draft_cfg = configs(args.smoke_cpu)
    if args.dry_run:
        print(f"dry run: imports ok; target {target_cfg.num_hidden_layers} layers, draft "
              f"{draft_cfg.num_hidden_layers} layers; CUDA kernels built={ops.HAS_CUDA_KERNELS}")
        return 0
    placed = device_and_dtype(args.smoke_cpu)
    if placed is None:
        return 2
    dev, dtype = placed
    torch.manual_seed(0)
    t0 = time.perf_counter()
    target, draft = random_model(target_cfg, dev, dtype), random_model(draft_cfg, dev, dtype)
    target.kernels = draft.kernels = kernels  # LLM.from_models keeps each model's own
    if dev == "cuda":
        torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    print(f"models built in {build_s:.1f} s (random {target_cfg.num_hidden_layers}-layer target, "
          f"{draft_cfg.num_hidden_layers}-layer draft, {str(dtype)[6:]}, {dev})", flush=True)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, target_cfg.vocab_size, (int(n),), generator=gen).tolist()
               for n in torch.randint(16, 200, (max(b for b, _ in sizes),), generator=gen)]
    if tree_width > 1:  # the engine calls engine.run_draft_tree, then the tree runner's run: this script only
        from specd.engine import engine as engine_module
        from specd.engine.draft_tree_graph import DraftTreeGraphRunner

        runner_cls, calls_of = DraftTreeGraphRunner, engine_module
        device_probe = None
        loop_probe = RunnerProbe(DraftTreeGraphRunner.run)
        probe = TreeProbe(engine_module.run_draft_tree, dev == "cuda", loop_probe)
        engine_module.run_draft_tree = probe
    else:  # the engine calls model_runner.run_draft: this script only
        runner_cls, calls_of = DraftGraphRunner, model_runner
        loop_probe = RunnerProbe(DraftGraphRunner.run)
        probe = DraftProbe(model_runner.run_draft, dev == "cuda", loop_probe)
        model_runner.run_draft = probe
        # the draft call of "drafts kept on device" (run_draft calls it too: passed through
        # while this probe is not enabled)
        device_probe = DraftProbe(model_runner.run_draft_on_device, dev == "cuda", loop_probe)
        model_runner.run_draft_on_device = device_probe
    loop_probe.install(runner_cls)
    rows, failures, skipped = [], [], []
    meta = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)", "torch": torch.__version__,
            "max_tokens": max_tokens, "budget_s": args.budget_s, "model_build_s": round(build_s, 1),
            "temperature": args.temperature,
            "kernels": {f: getattr(kernels, f) for f in KernelChoice.__dataclass_fields__},
            "tree_width": tree_width}

    def save() -> None:
        os.makedirs(args.out, exist_ok=True)
        with open(path, "w") as f:
            json.dump({"meta": meta, "rows": rows, "failures": failures, "skipped": skipped,
                       "probe_errors": probe.errors}, f, indent=1)

    save()
    print(HEADER, flush=True)
    last_case_s = 0.0
    try:
        for batch, k in sizes:
            outputs = {}  # layers -> mode -> outputs
            # batch > 1: without the runner's eager mode, and the slow eager loop last, to fit the budget
            slow = (TREE_MODES[0], TREE_MODES[1]) if tree_width > 1 else (MODES[0], MODES[1])
            order = modes if batch == 1 else [m for m in modes if m not in slow] + [slow[0]]
            cases = [(m, layers) for m in order
                     for layers in (("torch", "fused") if args.torch_layers and m in GRAPH_MODES else ("fused",))]
            for mode, layers in cases:
                elapsed = time.perf_counter() - start
                if elapsed >= args.budget_s or elapsed + last_case_s > args.budget_s:
                    skipped.append(f"{mode} ({layers} layers) b={batch} k={k}")
                    print(f"SKIPPED (budget {args.budget_s:.0f} s, {elapsed:.0f} s used): {skipped[-1]}", flush=True)
                    save()
                    continue
                t_case = time.perf_counter()
                same_layers = outputs.setdefault(layers, {})
                try:
                    r, same_layers[mode] = run_mode(mode, layers, target, draft, prompts, batch, k, max_tokens,
                                                    probe, loop_probe, tree_width, device_probe, args.temperature)
                except Exception as e:  # keep the other modes' numbers
                    failures.append(f"{mode} ({layers} layers) b={batch} k={k}: {type(e).__name__}: {e}")
                    print("FAILED", failures[-1], file=sys.stderr, flush=True)
                    save()
                    continue
                last_case_s = time.perf_counter() - t_case
                r["case_s"] = round(last_case_s, 1)
                first = next(iter(same_layers))  # greedy speculation is lossless: every mode must agree
                r["same_outputs_as_first_mode"] = same_layers[mode] == same_layers[first]
                rows.append(r)
                print_row(r)
                save()
    finally:
        setattr(calls_of, "run_draft_tree" if tree_width > 1 else "run_draft", probe.real)
        if device_probe is not None:
            model_runner.run_draft_on_device = device_probe.real
        loop_probe.uninstall(runner_cls)
    for e in probe.errors[:3]:
        print("probe:", e, file=sys.stderr)
    print(f"done in {time.perf_counter() - start:.0f} s; {len(rows)} rows, {len(skipped)} skipped, "
          f"{len(failures)} failed. host us/step = wall us/step - gpu us/step (the GPU time of the same draft "
          f"call from the profiler): the host-side overhead per draft step", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
