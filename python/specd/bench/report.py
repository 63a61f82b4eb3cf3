"""Turning benchmark samples into the table, the JSON and the plots of `specd bench`.

Per configuration (medians over repetitions, per prompt, then summed over prompts):
- tokens/s = generated tokens / seconds;
- speedup = tokens/s over the same system's plain decoding;
- acceptance = accepted / proposed drafts (specd);
- tokens/step = generated tokens per target forward that decided tokens (mean accepted
  length, bonus included; for HF: per target forward, prefill included);
- time split = shares of wall time in target forwards, draft forwards, everything else;
- ideal = E / (1 + k c), the classic speedup that the measured mean accepted length E and
  the measured draft cost allow. Here c is the time of one draft forward over one plain
  target decode step, and verification is assumed to cost one plain step with no other
  overhead. efficiency = speedup / ideal (specd speculative configurations);
- verify cost = measured time of one verify forward (1 + drafts tokens) over one plain
  target decode step. Where it exceeds 1 (CPUs whose multi-row matmuls are not nearly free,
  e.g. bfloat16 without AVX-512-BF16/AMX), the hardware, not the runtime, keeps speedup
  below the ideal;
- identical = every output token equals the same system's plain greedy output.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Optional

import torch

from specd.bench.runners import Results, Sample
from specd.hardware import cpu_flags, cpu_model


def _median_sample(samples: list[Sample]) -> Sample:
    ordered = sorted(samples, key=lambda s: s.seconds)
    return ordered[len(ordered) // 2]


def summarize(results: Results) -> list[dict]:
    med = {c.label: [_median_sample(results.samples[c.label][p]) for p in results.prompts] for c in results.configs}
    plain = {"specd": "specd none", "hf": "hf plain"}
    base_step = None
    if plain["specd"] in med:
        s = med[plain["specd"]]
        base_step = sum(x.target_s for x in s) / max(1, sum(x.verify_steps for x in s))
    rows = []
    for c in results.configs:
        s = med[c.label]
        tokens = sum(len(x.tokens) for x in s)
        seconds = sum(x.seconds for x in s)
        target_s, draft_s = sum(x.target_s for x in s), sum(x.draft_s for x in s)
        drafted, accepted = sum(x.draft_tokens for x in s), sum(x.accepted_tokens for x in s)
        steps = sum(x.verify_steps for x in s)
        row = {"config": c.label, "system": c.system, "method": c.method, "k": c.k, "tokens": tokens,
               "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else 0.0,
               "acceptance": accepted / drafted if drafted else None,
               "tokens_per_step": tokens / steps if steps else None,
               "target_share": target_s / seconds, "draft_share": draft_s / seconds,
               "other_share": max(0.0, 1 - (target_s + draft_s) / seconds)}
        plain_label = plain[c.system]
        if plain_label in med:
            base = med[plain_label]
            base_tps = sum(len(x.tokens) for x in base) / sum(x.seconds for x in base)
            row["speedup"] = row["tokens_per_s"] / base_tps
            row["identical_to_plain"] = all(a.tokens == b.tokens for a, b in zip(s, base))
        if c.system == "specd" and not c.is_plain and base_step and steps:
            forwards = sum(x.draft_forwards for x in s)
            cost = (draft_s / forwards) / base_step if forwards else 0.0
            row["draft_cost_ratio"] = cost
            row["verify_cost_ratio"] = (target_s / steps) / base_step
            row["ideal_speedup"] = (tokens / steps) / (1 + (c.k if c.method == "draft" else 0) * cost)
            row["efficiency"] = row.get("speedup", 0.0) / row["ideal_speedup"]
        rows.append(row)
    return rows


def headline(rows: list[dict]) -> dict:
    """The three targets of the benchmark, as measured (reported, not asserted)."""
    by = {r["config"]: r for r in rows}
    spec = [r for r in rows if r["system"] == "specd" and r["method"] == "draft"]
    best = max(spec, key=lambda r: r["tokens_per_s"]) if spec else None
    out = {}
    if best and "hf assisted" in by:
        out["best_specd_draft"] = best["config"]
        out["specd_over_hf_assisted"] = best["tokens_per_s"] / by["hf assisted"]["tokens_per_s"]
    if "specd none" in by:
        out["overhead_share_plain"] = by["specd none"]["other_share"]
    if best:
        out["overhead_share_best_draft"] = best["other_share"]
        out["efficiency_best_draft"] = best.get("efficiency")
    return out


def _fmt(v, pattern: str) -> str:
    return "-" if v is None else pattern.format(v)


def table(rows: list[dict]) -> str:
    head = (f"{'config':<22}{'tok/s':>8}{'speedup':>9}{'accept':>8}{'tok/step':>9}"
            f"{'target':>8}{'draft':>7}{'other':>7}{'ideal':>7}{'effic.':>8}{'verify':>8}  identical")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['config']:<22}{r['tokens_per_s']:>8.2f}{_fmt(r.get('speedup'), '{:.2f}x'):>9}"
                     f"{_fmt(r['acceptance'], '{:.2f}'):>8}{_fmt(r['tokens_per_step'], '{:.2f}'):>9}"
                     f"{r['target_share'] * 100:>7.0f}%{r['draft_share'] * 100:>6.0f}%{r['other_share'] * 100:>6.1f}%"
                     f"{_fmt(r.get('ideal_speedup'), '{:.2f}'):>7}{_fmt(r.get('efficiency'), '{:.0%}'):>8}"
                     f"{_fmt(r.get('verify_cost_ratio'), '{:.2f}x'):>8}  "
                     f"{_fmt(r.get('identical_to_plain'), '{}')}")
    return "\n".join(lines)


def machine() -> dict:
    return {"platform": platform.platform(), "cpu": cpu_model() or platform.processor() or platform.machine(),
            "cpu_flags": cpu_flags(), "python": platform.python_version(), "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def write_json(path: Path, rows: list[dict], info: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "specd bench", "info": info, "machine": machine(),
                                "headline": headline(rows), "rows": rows}, indent=1))


def write_plots(directory: Path, rows: list[dict]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    draft = sorted((r for r in rows if r["method"] == "draft"), key=lambda r: r["k"])
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if draft:
        ax.plot([r["k"] for r in draft], [r.get("speedup", 0) for r in draft], "o-", label="specd draft model")
    styles = {"specd ngram": "C1", "specd suffix": "C2", "hf assisted": "C3", "hf prompt_lookup": "C4"}
    for label, color in styles.items():
        row = next((r for r in rows if r["config"].startswith(label)), None)
        if row and row.get("speedup") is not None:
            ax.axhline(row["speedup"], color=color, ls="--", label=f"{row['config']} (vs own plain)")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("k (draft tokens per step)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title("Speedup vs k, greedy, batch 1")
    ax.legend(fontsize=8)
    speedup_png = directory / "speedup_vs_k.png"
    fig.tight_layout()
    fig.savefig(speedup_png, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1.2))
    labels = [r["config"] for r in rows]
    ms = [[1e3 * r["seconds"] * r[share] / r["tokens"] for r in rows]
          for share in ("target_share", "draft_share", "other_share")]
    left = [0.0] * len(rows)
    for values, name in zip(ms, ("target forward", "draft forward", "everything else")):
        ax.barh(labels, values, left=left, label=name)
        left = [a + b for a, b in zip(left, values)]
    ax.invert_yaxis()
    ax.set_xlabel("ms per generated token")
    ax.set_title("Where the time goes")
    ax.legend(fontsize=8)
    breakdown_png = directory / "time_breakdown.png"
    fig.tight_layout()
    fig.savefig(breakdown_png, dpi=110)
    plt.close(fig)
    return [speedup_png, breakdown_png]
