"""``specd bench load``: requests arriving as a Poisson process at a sweep of rates, served by
the continuous-batching engine under each speculation policy, in one run: no speculation,
static k in {1, 2, 4, 8}, switch-off and goodput. Per rate and policy it reports request
latency (mean, p50, p99), time to first token, time per output token, throughput and
goodput, and checks that every greedy output equals the recorded/plain one.

Two clocks (``LoadRun.clock``):
- "wall": the real engine on the real models, arrivals on the wall clock.
- "virtual": the engine's scheduling, proposing, verification and policy decisions run for
  real, but every forward's time comes from a synthetic GPU profile (SyntheticTimer), and
  the clock advances by the modelled step times. Arrivals are placed on that clock. This is
  the SYNTHETIC mode: it shows what the policies do where verification is cheap up to a
  compute knee and then costly, which a 2-core CPU cannot show.

Definitions (per run): latency = finish - arrival; TTFT = first token - arrival; TPOT =
(finish - first token) / (tokens - 1), averaged over requests; throughput = generated
tokens / (last finish - first arrival); goodput = generated tokens / engine busy time (the
quantity the goodput policy maximizes).
"""

from __future__ import annotations

import re
import textwrap
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from specd.bench.divergence import first_difference
from specd.engine.params import SamplingParams, SpeculationConfig
from specd.engine.policies import make_policy
from specd.engine.policy_trace import TracedPolicy


@dataclass(frozen=True)
class PolicySpec:
    label: str
    speculation: SpeculationConfig


def default_policies(method: str, ks: Sequence[int] = (1, 2, 4, 8), switch_off_k: int = 4,
                     switch_off_batch: int = 4, max_k: int = 8) -> list[PolicySpec]:
    """none, static k for each k, switch_off (k while the batch is small), goodput (auto)."""
    specs = [PolicySpec("none", SpeculationConfig(method="none"))]
    specs += [PolicySpec(f"static k={k}", SpeculationConfig(method=method, num_speculative_tokens=k)) for k in ks]
    specs.append(PolicySpec(f"switch_off k={switch_off_k}<=b{switch_off_batch}", SpeculationConfig(
        method=method, num_speculative_tokens=switch_off_k, policy="switch_off", switch_off_batch=switch_off_batch)))
    specs.append(PolicySpec("goodput", SpeculationConfig(method=method, num_speculative_tokens="auto",
                                                         max_speculative_tokens=max_k)))
    return specs


def poisson_arrivals(rate: float, n: int, seed: int) -> list[float]:
    """n arrival times of a Poisson process of ``rate`` requests/s starting at 0."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


MAX_DIVERGENCES = 8  # differing requests recorded per run


@dataclass
class RunResult:
    policy: str
    rate: float
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)
    tokens: int = 0
    makespan: float = 0.0
    busy: float = 0.0
    mean_batch: float = 0.0
    engine_metrics: dict = field(default_factory=dict)
    # The run's steps and their time by phase (seconds, as the engine's clock counts them):
    # target forwards, draft forwards, and everything else (scheduling, proposing, the
    # policy's decisions, verification, input packing; on the virtual clock the profile's
    # constant step overhead).
    steps: int = 0
    target_s: float = 0.0
    draft_s: float = 0.0
    other_s: float = 0.0
    identical: bool = True
    # Requests whose output differed from the expected one: the prompt's index, the first
    # differing position and the output up to and including it (bench/divergence.py).
    divergences: list = field(default_factory=list)

    def summary(self) -> dict:
        lat = np.asarray(self.latencies)
        return {"policy": self.policy, "rate": self.rate, "requests": len(self.latencies),
                "latency_mean_s": float(lat.mean()), "latency_p50_s": float(np.percentile(lat, 50)),
                "latency_p99_s": float(np.percentile(lat, 99)), "ttft_mean_s": float(np.mean(self.ttfts)),
                "tpot_mean_s": float(np.mean(self.tpots)) if self.tpots else 0.0,
                "throughput_tok_s": self.tokens / self.makespan if self.makespan > 0 else 0.0,
                "goodput_tok_s": self.tokens / self.busy if self.busy > 0 else 0.0,
                "mean_batch": self.mean_batch, "mean_k": self.engine_metrics.get("mean_k", 0.0),
                "speculating_share": self.engine_metrics.get("speculating_share", 0.0),
                "acceptance_rate": self.engine_metrics.get("acceptance_rate", 0.0),
                "steps": self.steps, **{f"{phase}_ms_per_step": 1e3 * getattr(self, f"{phase}_s") / max(1, self.steps)
                                        for phase in ("target", "draft", "other")},
                "identical_outputs": self.identical, "divergences": self.divergences}


def run_load(llm, prompts: Sequence[list[int]], arrivals: Sequence[float], max_tokens: int, clock: str,
             expected: Optional[Sequence[list[int]]] = None, label: str = "", rate: float = 0.0) -> RunResult:
    """Serves request i = prompts[i % len(prompts)] arriving at arrivals[i] (seconds on the
    clock: "virtual" = engine step times, "wall" = real time). ``expected[i % len]``: the
    greedy output each must equal."""
    if clock not in ("virtual", "wall"):
        raise ValueError(f"clock must be 'virtual' or 'wall', got {clock!r}")
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    pending = deque(enumerate(arrivals))
    active: dict[int, tuple] = {}   # request id -> (its output tokens so far, index, arrival)
    first: dict[int, float] = {}
    result = RunResult(label, rate)
    batch_sizes = []
    t0 = time.perf_counter()
    now = 0.0
    busy_before = engine.timings.step_s
    t = engine.timings
    phases_before = (t.steps, t.target_forward_s, t.draft_forward_s, t.other_s)
    while pending or active:
        while pending and pending[0][1] <= now:
            i, at = pending.popleft()
            active[llm.add_request(list(prompts[i % len(prompts)]), params)] = ([], i, at)
        if not active:
            wait = pending[0][1]
            if clock == "wall":
                time.sleep(max(0.0, wait - (time.perf_counter() - t0)))
                now = time.perf_counter() - t0
            else:
                now = wait
            continue
        before = engine.timings.step_s
        batch_sizes.append(len(engine.scheduler.running) + min(engine.scheduler.num_waiting, 1))
        chunks = llm.step()
        now = now + (engine.timings.step_s - before) if clock == "virtual" else time.perf_counter() - t0
        for chunk in chunks:
            output, i, at = active[chunk.request_id]
            output.extend(chunk.token_ids)
            if chunk.request_id not in first and output:
                first[chunk.request_id] = now
            if not chunk.finished:
                continue
            del active[chunk.request_id]
            if chunk.finish_reason not in ("length", "stop"):
                raise RuntimeError(f"request {chunk.request_id} ended with {chunk.finish_reason!r}: {chunk.error}")
            n = len(output)
            result.latencies.append(now - at)
            result.ttfts.append(first[chunk.request_id] - at)
            if n > 1:
                result.tpots.append((now - first[chunk.request_id]) / (n - 1))
            result.tokens += n
            want = list(expected[i % len(expected)][:max_tokens]) if expected is not None else None
            if want is not None and output != want:
                result.identical = False
                pos = first_difference(want, output)
                if len(result.divergences) < MAX_DIVERGENCES:
                    result.divergences.append({"prompt": i % len(expected), "position": pos,
                                               "got": list(output[:pos + 1])})
    result.makespan = now - (arrivals[0] if arrivals else 0.0)
    result.busy = engine.timings.step_s - busy_before
    result.steps, result.target_s, result.draft_s, result.other_s = (
        after - before for after, before in zip((t.steps, t.target_forward_s, t.draft_forward_s, t.other_s),
                                                phases_before))
    result.mean_batch = float(np.mean(batch_sizes)) if batch_sizes else 0.0
    result.engine_metrics = engine.metrics()
    return result


def sweep(make_llm: Callable[[SpeculationConfig], object], policies: Sequence[PolicySpec],
          prompts: Sequence[list[int]], rates: Sequence[float], requests: int, max_tokens: int, clock: str,
          expected: Optional[Sequence[list[int]]] = None, seed: int = 0,
          log: Callable[[str], None] = print, warmup: Optional[list[int]] = None, reps: int = 1,
          trace_dir: Optional[Path] = None, warm_policies: bool = False) -> list[dict]:
    """Every policy at every rate (same arrivals for all policies of a rate); one summary row each.
    ``warmup``: a prompt every LLM serves once, untimed, before its arrivals (the same for every
    policy; a held-out prompt, so no proposer's cache has seen the timed ones).
    ``reps``: runs per policy and rate, each with an LLM from ``make_llm`` serving afresh (a
    new LLM, or one reset: a new engine and policy over the same graphs), interleaved (every
    policy once, then again) so that a drift of the machine's speed spreads over all policies, and each
    round's order rotated by ``len(policies) / reps`` (no policy always runs first or last in
    a round, where a machine warming up or slowing down would favour it); the row is
    the run of median mean latency, with every run's mean latency in ``latency_mean_s_runs``
    and ``identical_outputs`` over all runs.
    ``trace_dir``: every run's policy is wrapped in a TracedPolicy (engine/policy_trace.py) and
    its calls, warm-up included (``timed_from``: the first event of the timed arrivals), are
    written to ``rate<i>_<policy>_rep<j>.json`` there; ``make_llm`` is then called with the
    traced policy as ``policy=``.
    ``warm_policies``: each policy spec has one policy object for the whole sweep, passed to
    ``make_llm`` as ``policy=`` in every run, so what it learnt (costs, acceptance, load)
    carries over from run to run and rate to rate, as in a server that has been running;
    default: every run starts with a fresh policy. Every run ends with all its requests
    finished, so no request's state carries over. Traces of warm runs (``warm`` in their
    metadata) record only their own run's calls: a replay, which starts a fresh policy, does
    not reproduce them."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if trace_dir is not None:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
    rows = []
    kept = {spec.label: make_policy(spec.speculation.policy, spec.speculation) for spec in policies} \
        if warm_policies else {}
    for r, rate in enumerate(rates):
        arrivals = poisson_arrivals(rate, requests, seed + r)
        runs: dict[str, list[dict]] = {spec.label: [] for spec in policies}
        for rep in range(reps):
            shift = rep * len(policies) // reps
            for spec in list(policies[shift:]) + list(policies[:shift]):
                t = time.perf_counter()
                traced, policy = None, kept.get(spec.label)
                if trace_dir is not None:
                    policy = traced = TracedPolicy(policy or make_policy(spec.speculation.policy, spec.speculation))
                llm = make_llm(spec.speculation, policy=policy) if policy is not None else make_llm(spec.speculation)
                if warmup is not None:
                    llm.generate([list(warmup)], SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                ignore_eos=True))
                timed_from = len(traced.events) if traced is not None else 0
                run = run_load(llm, prompts, arrivals, max_tokens, clock, expected, spec.label, rate).summary()
                if traced is not None:
                    slug = re.sub(r"[^A-Za-z0-9]+", "_", spec.label).strip("_")
                    traced.save(Path(trace_dir) / f"rate{r}_{slug}_rep{rep}.json", policy=spec.label, rate=rate,
                                rep=rep, timed_from=timed_from, speculation=asdict(spec.speculation),
                                warm=warm_policies)
                runs[spec.label].append(run)
                log(f"rate {rate:.3g}/s {spec.label}{f' (run {rep + 1}/{reps})' if reps > 1 else ''}: mean latency "
                    f"{run['latency_mean_s']:.3f} s, mean k {run['mean_k']:.2f} ({time.perf_counter() - t:.1f} s)")
        for spec in policies:
            rows.append(_median_run(runs[spec.label]))
    return rows


def divergence_key(d: dict) -> tuple:
    """What makes two recorded divergences (RunResult.divergences) the same: the prompt, the
    first differing position and the token produced there (none: the output ended first)."""
    return d["prompt"], d["position"], tuple(d["got"][-1:])


def _median_run(runs: list[dict]) -> dict:
    """The run of median mean latency (the lower middle one for an even count), annotated."""
    ordered = sorted(runs, key=lambda x: x["latency_mean_s"])
    row = dict(ordered[(len(ordered) - 1) // 2])
    row["reps"] = len(runs)
    row["latency_mean_s_runs"] = [x["latency_mean_s"] for x in runs]
    row["identical_outputs"] = all(x["identical_outputs"] for x in runs)
    seen, row["divergences"] = set(), []
    for d in (d for x in runs for d in x["divergences"]):
        key = divergence_key(d)
        if key not in seen:
            seen.add(key)
            row["divergences"].append(d)
    return row


def compare(rows: list[dict]) -> list[dict]:
    """Per rate: the goodput policy's mean latency against no speculation and the best static k."""
    out = []
    for rate in sorted({r["rate"] for r in rows}):
        at = [r for r in rows if r["rate"] == rate]
        by = {r["policy"]: r for r in at}
        statics = [r for r in at if r["policy"].startswith("static")]
        if "goodput" not in by or "none" not in by or not statics:
            continue
        best = min(statics, key=lambda r: r["latency_mean_s"])
        g = by["goodput"]["latency_mean_s"]
        out.append({"rate": rate, "mean_batch": by["none"]["mean_batch"], "best_static": best["policy"],
                    "goodput_vs_best_static": g / best["latency_mean_s"],
                    "goodput_vs_none": g / by["none"]["latency_mean_s"],
                    "none_over_goodput_speedup": by["none"]["latency_mean_s"] / g})
    return out


def table(rows: list[dict]) -> str:
    head = (f"{'rate/s':>8} {'policy':<20} {'batch':>6} {'mean k':>6} {'acc':>5} {'lat mean':>9} {'p50':>8} "
            f"{'p99':>8} {'TTFT':>8} {'TPOT ms':>8} {'thru t/s':>9} {'good t/s':>9} {'host ms':>7} {'same':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['rate']:>8.3g} {r['policy']:<20} {r['mean_batch']:>6.1f} {r['mean_k']:>6.2f} "
                     f"{r['acceptance_rate']:>5.2f} {r['latency_mean_s']:>9.3f} {r['latency_p50_s']:>8.3f} "
                     f"{r['latency_p99_s']:>8.3f} {r['ttft_mean_s']:>8.3f} {1000 * r['tpot_mean_s']:>8.2f} "
                     f"{r['throughput_tok_s']:>9.1f} {r['goodput_tok_s']:>9.1f} {r['other_ms_per_step']:>7.2f} "
                     f"{'yes' if r['identical_outputs'] else 'NO':>5}")
    return "\n".join(lines)


def comparison_table(cmp: list[dict]) -> str:
    head = (f"{'rate/s':>8} {'batch':>6} {'best static':<12} {'goodput/best static':>20} "
            f"{'goodput/none':>13} {'speedup vs none':>16}")
    lines = [head, "-" * len(head)]
    for c in cmp:
        lines.append(f"{c['rate']:>8.3g} {c['mean_batch']:>6.1f} {c['best_static']:<12} "
                     f"{c['goodput_vs_best_static']:>20.3f} {c['goodput_vs_none']:>13.3f} "
                     f"{c['none_over_goodput_speedup']:>16.2f}")
    return "\n".join(lines)


def plot(rows: list[dict], path, title: str) -> None:
    """Mean and p99 latency vs arrival rate, one line per policy (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for policy in dict.fromkeys(r["policy"] for r in rows):
        rs = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["rate"])
        style = dict(linewidth=2.5, color="black") if policy == "goodput" else dict(linewidth=1.2)
        for ax, key in zip(axes, ("latency_mean_s", "latency_p99_s")):
            ax.plot([r["rate"] for r in rs], [r[key] for r in rs], marker="o", label=policy, **style)
    for ax, name in zip(axes, ("mean", "p99")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arrival rate (requests/s)")
        ax.set_ylabel(f"{name} request latency (s)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 160), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
