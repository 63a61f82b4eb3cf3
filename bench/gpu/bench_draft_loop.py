"""Host-side overhead of the draft model's k-step loop on the lent GPU: the plain eager loop
(run_draft, torch attention) against the draft graph runner (engine/draft_graph.py) eager and
captured in CUDA graphs, through the whole engine.

    python bench/gpu/bench_draft_loop.py [--quick] [--out DIR] [--dry-run]

Models: random-weight Llama-family models with the shapes of the real pair (target like
Qwen2.5-Coder-1.5B, draft like 0.5B: 24 layers, hidden 896, 14/2 heads, vocab 151,936), bf16,
built in memory (no download; acceptance is meaningless, timing is not). For each batch size
and k, one LLM per mode generates the same greedy requests after a warm-up run (which also
captures the graphs); reported: draft milliseconds per draft forward (the engine's timer:
draft time / draft forwards, forward 0 included), the draft share of the step, and whether
the outputs equal the plain loop's (they must: greedy speculation is lossless). Writes
bench_draft_loop.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

MODES = ("eager loop", "graph runner, eager", "graph runner, CUDA graph")


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


def random_model(config, dev, dtype):
    from specd.models.llama import LlamaModel

    with torch.device(dev):
        model = LlamaModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.02 * torch.randn_like(p))
    return model.to(dtype).eval()


def run_mode(mode, target, draft, prompts, batch, k, max_tokens):
    import specd
    from specd.engine.draft_graph import DraftGraphConfig, DraftGraphRunner

    spec = specd.SpeculationConfig(method="draft", num_speculative_tokens=k)
    llm = specd.LLM.from_models(target, draft, spec, device=draft.device, max_num_seqs=batch, max_model_len=2048,
                                num_kv_pages=4096 if draft.device.type == "cuda" else 256,
                                draft_graph=mode != MODES[0])
    if mode == MODES[1]:  # the runner's loop without capture
        old = llm.draft_graph
        llm.pool.draft_graph = DraftGraphRunner(llm.draft, llm.pool, DraftGraphConfig(
            max_steps=old.config.max_steps, max_blocks=old.config.max_blocks, buckets=old.config.buckets,
            capture=False))
    params = specd.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:batch], params)  # warm-up (and graph capture)
    llm.engine.timings.reset()
    t0 = time.perf_counter()
    outs = llm.generate(prompts[:batch], params)
    wall = time.perf_counter() - t0
    t = llm.engine.timings
    return {"mode": mode, "batch": batch, "k": k, "draft_ms_per_forward": 1e3 * t.draft_forward_s / max(1, t.draft_forwards),
            "draft_forwards": t.draft_forwards, "draft_share": t.draft_forward_s / t.step_s if t.step_s else 0.0,
            "tokens_per_s": sum(len(o.token_ids) for o in outs) / wall}, [o.token_ids for o in outs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="check imports and print the plan (no GPU needed)")
    ap.add_argument("--quick", action="store_true", help="fewer sizes and tokens")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench-results")
    ap.add_argument("--smoke-cpu", action="store_true",
                    help="tiny float32 models on the CPU, no CUDA graph mode: checks the script, times nothing")
    args = ap.parse_args(argv)
    import specd.ops as ops
    from specd.engine.draft_graph import DraftGraphRunner  # noqa: F401  (import check)

    sizes = [(1, 4), (8, 4)] if args.quick or args.smoke_cpu else [(1, 4), (8, 4), (32, 4), (8, 8)]
    max_tokens = 24 if args.quick or args.smoke_cpu else 48
    modes = MODES[:2] if args.smoke_cpu else MODES
    print(f"plan: draft loop, (batch, k) in {sizes}, {max_tokens} tokens, modes {list(MODES)}; "
          f"JSON -> {args.out}/bench_draft_loop.json")
    target_cfg, draft_cfg = configs(args.smoke_cpu)
    if args.dry_run:
        print(f"dry run: imports ok; target {target_cfg.num_hidden_layers} layers, draft "
              f"{draft_cfg.num_hidden_layers} layers; CUDA kernels built={ops.HAS_CUDA_KERNELS}")
        return 0
    if args.smoke_cpu:
        dev, dtype = "cpu", torch.float32
    elif not torch.cuda.is_available() or not ops.HAS_CUDA_KERNELS:
        print("needs a CUDA device and a specd build with CUDA kernels (or --smoke-cpu)", file=sys.stderr)
        return 2
    else:
        dev, dtype = "cuda", torch.bfloat16
    torch.manual_seed(0)
    target, draft = random_model(target_cfg, dev, dtype), random_model(draft_cfg, dev, dtype)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, target_cfg.vocab_size, (int(n),), generator=gen).tolist()
               for n in torch.randint(16, 200, (max(b for b, _ in sizes),), generator=gen)]
    rows, failures = [], []
    for batch, k in sizes:
        outputs = {}
        for mode in modes:
            try:
                r, outputs[mode] = run_mode(mode, target, draft, prompts, batch, k, max_tokens)
            except Exception as e:  # keep the other modes' numbers
                failures.append(f"{mode} b={batch} k={k}: {type(e).__name__}: {e}")
                print("FAILED", failures[-1], file=sys.stderr)
                continue
            r["same_outputs_as_eager"] = outputs[mode] == outputs.get(MODES[0])
            rows.append(r)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_draft_loop.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)", "rows": rows,
                   "failures": failures}, f, indent=1)
    print(f"{'mode':<26} {'batch':>5} {'k':>3} {'draft ms/fwd':>12} {'draft share':>11} {'tok/s':>8}  same")
    for r in rows:
        print(f"{r['mode']:<26} {r['batch']:>5} {r['k']:>3} {r['draft_ms_per_forward']:>12.3f} "
              f"{r['draft_share']:>11.2f} {r['tokens_per_s']:>8.1f}  {r['same_outputs_as_eager']}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
