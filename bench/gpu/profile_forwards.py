"""Forward-time profile of the real pair's shapes on the lent GPU, for the load benchmark's
simulated mode (``specd bench load --simulated --gpu-profile FILE``): measured step costs in
place of the synthetic knee model, while acceptance still comes from the real pair's traces.

    python bench/gpu/profile_forwards.py [--out DIR] [--context N] [--reps N] [--dry-run]

Models: random-weight models shaped like the pair (bench_draft_loop.configs: a 28-layer
Qwen2.5-1.5B-like target, a 24-layer 0.5B-like draft, vocabulary 151,936), bf16, with the
engine's GPU defaults: fused layer kernels and KernelAttention over a paged cache. Each point
is one forward of `batch` sequences x `query` new tokens over `context` cached tokens each
(causal), captured in a CUDA graph and replayed (median of --reps replays timed with CUDA
events): the decode/verify shapes (batch 1..64 x query 1..9, logits for every new row) and
prefill shapes (one sequence of 128..2048 tokens, and 4 x 256 and 8 x 128 tokens of several
sequences; logits for each sequence's last row). Weights are random, so only the times mean
anything.

Then the engine's per-step time outside the forwards (scheduling, proposing, verifying,
sampling on the host side), step by step with its shape (requests, drafting requests, draft
tokens, draft forwards: specd.StepShape), from LLM.generate runs with both graph runners:
plain decoding and the draft model at k = 1, 2 and 4, batch 1, 8 and 16. Speculation has host
costs of its own, so one average is not enough: the steps are fitted by specd's
OverheadModel (the goodput controller's own model, overhead_model.h) into a constant and the
costs per request, drafting request, draft token and draft forward, written as
"step_overhead_ms" (the constant) and "host_ms", which `specd bench load --simulated
--gpu-profile` charges by each simulated step's shape. Per run, the mean overhead per step is
kept too ("step_overhead_ms_by_run").

Writes gpu_forward_profile.json (gpu_forward_profile_per_head.json / _grouped.json with --attention-kernel per_head / grouped): {"meta", "models": {"target": [points], "draft": [points]},
"step_overhead_ms", "host_ms", "step_overhead_ms_by_run"} with points {"batch", "query",
"tokens", "context", "ms"}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_draft_loop import configs, random_model  # noqa: E402

DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
QUERIES = {"target": (1, 2, 3, 5, 9), "draft": (1, 2, 3, 5)}
PREFILL = (128, 256, 512, 1024, 2048)
# Prefills of several prompts in one forward (batch x prompt tokens, no context): the engine's
# prefill steps hold several prompts; these points check the load benchmark's per-key model
# (engine/timer.py MeasuredProfile), which is fitted on the single-prompt prefills above.
MULTI_PREFILL = ((4, 256), (8, 128))


def captured_forward(model, batch: int, query: int, context: int, logits_rows: str):
    """A CUDA graph of one forward of batch x query new tokens over `context` cached ones per
    sequence (random KV, causal), and what it must keep alive. logits_rows: "all" new rows, or
    "last" (each sequence's last row)."""
    from specd.models.attention import LayerKV
    from specd.models.kernel_attention import DeviceAttentionMetadata, kernel_attention_for

    dev, c = model.device, model.config
    block = 16
    per_seq = (context + query + block - 1) // block
    pages = batch * per_seq + 1
    kv = []
    for _ in range(c.num_hidden_layers):
        k = torch.randn(pages, block, c.num_key_value_heads, c.head_dim, device=dev, dtype=model.dtype) * 0.1
        kv.append(LayerKV(k=k, v=k.clone()))
    table = torch.arange(batch * per_seq, device=dev, dtype=torch.int32).view(batch, per_seq)
    pos = torch.arange(context, context + query, device=dev).repeat(batch)  # [B q]
    seq = torch.arange(batch, device=dev).repeat_interleave(query)
    slots = (table[seq, pos // block].long() * block + pos % block)
    meta = DeviceAttentionMetadata(pos, slots, table, torch.arange(0, batch * query + 1, query, device=dev,
                                                                   dtype=torch.int32),
                                   torch.full((batch,), context + query, device=dev, dtype=torch.int32))
    ids = torch.randint(0, c.vocab_size, (batch * query,), device=dev)
    rows = None if logits_rows == "all" else torch.arange(query - 1, batch * query, query, device=dev)
    backend = kernel_attention_for(model)  # the model's KernelChoice (--attention-kernel)
    run = lambda: model(ids, meta, kv, rows, backend=backend)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph, (kv, meta, ids, rows)


def forward_ms(model, batch: int, query: int, context: int, logits_rows: str, reps: int) -> float:
    """Median ms of a captured forward (captured_forward) over `reps` replays."""
    graph, keep = captured_forward(model, batch, query, context, logits_rows)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph, keep
    torch.cuda.empty_cache()
    return statistics.median(times)


def profile_model(name, model, context: int, reps: int) -> list[dict]:
    points = []
    for batch in DECODE_BATCHES:
        for query in QUERIES[name]:
            ms = forward_ms(model, batch, query, context, "all", reps)
            points.append({"batch": batch, "query": query, "tokens": batch * query, "context": context,
                           "ms": round(ms, 4)})
            print(f"{name:<6} batch {batch:>3} x query {query} ({batch * query:>4} tokens, context {context}): "
                  f"{ms:8.3f} ms", flush=True)
    for tokens in PREFILL:
        ms = forward_ms(model, 1, tokens, 0, "last", reps)
        points.append({"batch": 1, "query": tokens, "tokens": tokens, "context": 0, "ms": round(ms, 4)})
        print(f"{name:<6} prefill {tokens:>4} tokens: {ms:8.3f} ms", flush=True)
    for batch, tokens in MULTI_PREFILL:
        ms = forward_ms(model, batch, tokens, 0, "last", reps)
        points.append({"batch": batch, "query": tokens, "tokens": batch * tokens, "context": 0, "ms": round(ms, 4)})
        print(f"{name:<6} prefill {batch} x {tokens} tokens: {ms:8.3f} ms", flush=True)
    return points


HOST_RUNS = ((0, (1, 8, 16)), (1, (1, 8, 16)), (2, (1, 8, 16)), (4, (1, 8, 16)))  # (k, batches); k = 0: plain


def step_host_times(target, draft, runs=HOST_RUNS, max_tokens: int = 24) -> tuple[dict, list]:
    """Engine time per step outside the forwards, with both graph runners on a GPU (module doc):
    the mean per run, and every timed step as (ms, StepShape)."""
    import specd
    from specd.engine.timer import WallTimer

    class ShapeTimer(WallTimer):
        """The wall clock, keeping each step's time outside the forwards and its shape."""

        def __init__(self):
            super().__init__(sync_cuda=target.device.type == "cuda")
            self.steps = []

        def step_seconds(self, forward_seconds, shape=None):
            seconds = super().step_seconds(forward_seconds, shape)
            self.steps.append((1e3 * (seconds - forward_seconds), shape))
            return seconds

    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, target.config.vocab_size, (int(n),), generator=gen).tolist()
               for n in torch.randint(16, 200, (16,), generator=gen)]
    params = specd.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    by_run, steps = {}, []
    for k, batches in runs:
        spec = (specd.SpeculationConfig(method="none") if k == 0
                else specd.SpeculationConfig(method="draft", num_speculative_tokens=k))
        for batch in batches:
            timer = ShapeTimer()
            llm = specd.LLM.from_models(target, draft if k else None, spec, device=target.device, max_num_seqs=batch,
                                        max_model_len=2048, num_kv_pages=8192, timer=timer)
            llm.generate(prompts[:batch], params)  # warm-up, graph capture
            timer.steps.clear()
            llm.generate(prompts[:batch], params)
            label = f"{'plain' if k == 0 else f'draft k={k}'}, batch {batch}"
            by_run[label] = round(statistics.mean(ms for ms, _ in timer.steps), 3)
            steps += timer.steps
            print(f"engine overhead per step, {label}: {by_run[label]:.3f} ms ({len(timer.steps)} steps)", flush=True)
    return by_run, steps


def fit_host_ms(steps) -> tuple[float, dict]:
    """(constant ms, host_ms) from timed steps by the controller's OverheadModel, fed every
    step without forgetting (decay close to 1: each run weighs alike)."""
    from specd import _core

    model = _core.OverheadModel()
    for _ in range(3):  # the model forgets 1% a step: repeat the runs so none dominates
        for ms, shape in steps:
            model.observe(ms / 1e3, shape.requests, shape.drafting_requests, shape.draft_tokens, shape.draft_forwards)
    c = [round(1e3 * x, 4) for x in model.coefficients]
    return c[0], {"per_request": c[1], "per_drafting_request": c[2], "per_draft_token": c[3],
                  "per_draft_forward": c[4]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench-results")
    ap.add_argument("--context", type=int, default=256, help="cached tokens per sequence at decode/verify points")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--attention-kernel", choices=("auto", "per_head", "grouped"), default="auto",
                    help="the CUDA tree-attention kernel of every forward (KernelChoice.grouped_attention: "
                         "auto = the engine's default, by query tokens per forward)")
    ap.add_argument("--dry-run", action="store_true", help="check imports and print the plan (no GPU needed)")
    args = ap.parse_args(argv)
    import specd.ops as ops
    from specd.models.kernel_choice import KernelChoice

    out_name = ("gpu_forward_profile.json" if args.attention_kernel == "auto"
                else f"gpu_forward_profile_{args.attention_kernel}.json")
    plan = (f"plan: target and draft, batch {DECODE_BATCHES} x query {QUERIES} at context {args.context}, prefill "
            f"{PREFILL} and {' and '.join(f'{b} x {n}' for b, n in MULTI_PREFILL)}; {args.reps} replays per point; {args.attention_kernel} attention kernel; JSON -> {os.path.join(args.out, out_name)}")
    print(plan, flush=True)
    if args.dry_run:
        return 0
    if not torch.cuda.is_available() or not ops.HAS_CUDA_KERNELS:
        print("needs a CUDA device and a specd build with CUDA kernels", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    torch.manual_seed(0)
    target_cfg, draft_cfg = configs()
    target, draft = random_model(target_cfg, "cuda", torch.bfloat16), random_model(draft_cfg, "cuda", torch.bfloat16)
    assert target.uses_fused() and draft.uses_fused()
    grouped = {"auto": "auto", "per_head": False, "grouped": True}[args.attention_kernel]
    target.kernels = draft.kernels = KernelChoice(grouped_attention=grouped)
    result = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bfloat16",
                       "layers": "fused", "attention": f"KernelAttention (specd tree_attention, {args.attention_kernel})",
                       "timing": f"CUDA graph replay, median of {args.reps}", "context": args.context,
                       "weights": "random (pair-shaped: bench_draft_loop.configs)"},
              "models": {}}
    with torch.inference_mode():
        for name, model in (("target", target), ("draft", draft)):
            result["models"][name] = profile_model(name, model, args.context, args.reps)
    by_run, steps = step_host_times(target, draft)
    result["step_overhead_ms_by_run"] = by_run
    result["step_overhead_ms"], result["host_ms"] = fit_host_ms(steps)
    result["meta"]["seconds"] = round(time.perf_counter() - t0, 1)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, out_name), "w") as f:
        json.dump(result, f, indent=1)
    print(f"done in {result['meta']['seconds']} s; host time per step {result['step_overhead_ms']} ms + "
          f"{result['host_ms']} (ms)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
