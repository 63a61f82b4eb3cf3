"""`specd bench`: specd (no speculation; draft model with k = 1..8; ngram; suffix) and HF
transformers (plain; assistant_model; prompt lookup) on the same weights and prompts, greedy,
measured in one run with repetitions interleaved (every rep runs every prompt with every
configuration before the next rep starts), so machine noise hits all configurations alike.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from specd.bench.prompts import BenchPrompt, builtin_prompts
from specd.bench.runners import BenchConfig, HFRunner, Results, SpecdRunner
from specd.models.loader import load_model

NGRAM_K = 6  # draft depth for the model-free proposers


def default_configs(quick: bool, has_draft: bool, include_hf: bool) -> list[BenchConfig]:
    """Full: specd none, draft k=1..8, ngram, suffix; HF plain, assisted, prompt lookup.
    Quick: specd none, draft k=3, ngram, suffix; HF plain, assisted."""
    ks = [3] if quick else list(range(1, 9))
    configs = [BenchConfig("specd", "none")]
    if has_draft:
        configs += [BenchConfig("specd", "draft", k) for k in ks]
    configs += [BenchConfig("specd", "ngram", NGRAM_K), BenchConfig("specd", "suffix", NGRAM_K)]
    if include_hf:
        configs.append(BenchConfig("hf", "plain"))
        if has_draft:
            configs.append(BenchConfig("hf", "assisted"))
        if not quick:
            configs.append(BenchConfig("hf", "prompt_lookup"))
    return configs


def run_suite(target_dir: Path, draft_dir: Optional[Path], *, quick: bool = False, reps: int = 3,
              max_tokens: int = 96, dtype: str = "bfloat16", device: str = "cpu", include_hf: bool = True,
              log: Callable[[str], None] = print) -> tuple[Results, list[BenchPrompt], dict]:
    t0 = time.perf_counter()
    target = load_model(target_dir, dtype)
    draft = load_model(draft_dir, dtype) if draft_dir is not None else None
    specd_runner = SpecdRunner(target, draft, dtype, max_tokens, device)
    hf_runner = HFRunner(target_dir, draft_dir, dtype, max_tokens, device) if include_hf else None
    log(f"loaded models in {time.perf_counter() - t0:.1f} s")
    prompts = builtin_prompts(target.tokenizer, quick)
    configs = default_configs(quick, draft is not None, include_hf)
    results = Results(configs, [p.name for p in prompts])

    def runner(c: BenchConfig):
        return specd_runner if c.system == "specd" else hf_runner

    # Warm-up (not measured): the first run of each configuration pays one-time costs.
    for c in configs:
        runner(c).run(c, prompts[0].text[:120], max_tokens=4)
    for rep in range(reps):
        t_rep = time.perf_counter()
        for p in prompts:
            for c in configs:
                results.add(c, p.name, runner(c).run(c, p.text))
        log(f"rep {rep + 1}/{reps} done in {time.perf_counter() - t_rep:.0f} s")
    info = {"target": str(target_dir), "draft": str(draft_dir) if draft_dir else None, "dtype": dtype,
            "device": device,
            "max_tokens": max_tokens, "reps": reps, "quick": quick,
            "prompt_tokens": {p.name: len(target.tokenizer(p.text)["input_ids"]) for p in prompts}}
    return results, prompts, info
