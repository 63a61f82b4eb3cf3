"""``specd bench load``: Poisson load sweep over speculation policies (see specd.bench.load)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import asdict
from pathlib import Path

from specd.cli.common import add_model_options, positive_floats, resolve_models


def add_parser(sub) -> None:
    p = sub.add_parser(
        "load", help="latency under Poisson load: no speculation vs static k vs switch-off vs goodput",
        description="Requests (the built-in prompts, greedy) arrive as a Poisson process at a sweep of rates; "
                    "every policy serves the same arrivals: none, static k=1,2,4,8, switch_off, goodput. Reports "
                    "mean/p50/p99 latency, TTFT, TPOT, throughput and goodput, and goodput's latency relative to "
                    "none and to the best static k. Default: the real models on this machine (wall clock; every "
                    "policy's LLM first serves one untimed warm-up request on a held-out prompt). "
                    "--simulated: the engine's real scheduling and acceptance decisions (replayed from greedy "
                    "traces recorded once on the real models) against a SYNTHETIC GPU cost profile.")
    add_model_options(p)
    p.add_argument("--simulated", action="store_true",
                   help="synthetic GPU step times (flat up to a compute knee, then linear) on a virtual clock")
    p.add_argument("--method", default=None, choices=["draft", "ngram", "suffix", "draft+suffix", "draft+ngram"],
                   help="proposer(s) of the speculating policies (default: draft when a draft model is used, "
                        "else suffix)")
    p.add_argument("--requests", type=int, default=None, help="requests per rate (default 64; real: 6)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per request (default 64; real: 12)")
    p.add_argument("--rates", type=positive_floats, default=None,
                   help="arrival rates in requests/s, comma-separated (default: 5 rates from 0.5 to 128 times "
                        "the single-request rate; real: 2 rates, 0.5x and 32x)")
    p.add_argument("--rate-multiples", type=positive_floats, default=None, metavar="M1,M2,...",
                   help="arrival rates as multiples of the single-request rate (1 / the latency of one request "
                        "served alone, measured first); instead of --rates")
    p.add_argument("--max-num-seqs", type=int, default=None, help="batch limit (default 64; real: 6)")
    p.add_argument("--switch-off-batch", type=int, default=4, help="switch_off policy: speculate up to this batch")
    p.add_argument("--seed", type=int, default=0, help="arrival process seed")
    p.add_argument("--reps", type=int, default=1,
                   help="runs per policy and rate, interleaved; rows report the run of median mean latency "
                        "(use 3 or more on the real pair, whose run-to-run noise is large)")
    p.add_argument("--warm-policies", action="store_true",
                   help="each policy keeps what it learnt (costs, acceptance, load) across all its runs, as in a "
                        "server that has been running (default: every run starts with a fresh policy, which "
                        "on short runs also measures its cold start)")
    g = p.add_argument_group("synthetic GPU profile (--simulated; seconds = base + max(0, tokens - knee) * per_token)")
    g.add_argument("--target-ms", type=float, default=20.0, help="target forward time below the knee (ms)")
    g.add_argument("--target-knee", type=int, default=64, help="tokens a target forward takes at flat cost")
    g.add_argument("--target-per-token-us", type=float, default=250.0, help="target cost per token above the knee")
    g.add_argument("--draft-ms", type=float, default=4.0, help="draft forward time below the knee (ms)")
    g.add_argument("--draft-knee", type=int, default=64)
    g.add_argument("--draft-per-token-us", type=float, default=50.0)
    g.add_argument("--overhead-ms", type=float, default=None,
                   help="constant per-step time outside the forwards (ms; default 0.5, or the GPU profile's)")
    g.add_argument("--gpu-profile", type=Path, metavar="JSON",
                   help="forward times MEASURED on a GPU (bench/gpu/profile_forwards.py; e.g. "
                        "docs/bench/gpu/h100_forward_profile.json) in place of the knee model")
    g.add_argument("--host-ms", metavar="R,D,T,F",
                   help="host time by step shape on top of the step overhead, in ms: per request, per drafting "
                        "request, per draft token, per draft forward (speculation's own host costs; default: the "
                        "GPU profile's host_ms, else none)")
    p.add_argument("--json", type=Path, help="write rows, comparison and settings as JSON here")
    p.add_argument("--plot", type=Path, help="write latency-vs-rate PNG into this directory")
    p.add_argument("--trace", type=Path, metavar="DIR",
                   help="record every run's policy calls (inputs, measured forwards, decisions) as JSON in DIR, "
                        "for inspection and for specd.engine.policy_trace.replay")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specd.bench import load

    for name in ("requests", "max_tokens", "max_num_seqs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"specd bench load: error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if args.rates is not None and args.rate_multiples is not None:
        print("specd bench load: error: give --rates or --rate-multiples, not both", file=sys.stderr)
        return 2
    sim = args.simulated
    args.requests = args.requests or (64 if sim else 6)
    args.max_tokens = args.max_tokens or (64 if sim else 12)
    args.max_num_seqs = args.max_num_seqs or (64 if sim else 6)
    want_draft = args.method is None or "draft" in args.method
    target, draft = resolve_models(args, want_draft=want_draft and (args.target is None or args.draft is not None))
    method = args.method or ("draft" if draft is not None else "suffix")
    if "draft" in method and draft is None:
        print("specd bench load: error: --method draft needs --draft", file=sys.stderr)
        return 2
    log = lambda m: print(f"[specd bench load] {m}", file=sys.stderr, flush=True)  # noqa: E731
    setup = (_simulated if sim else _real)(args, target, draft, method, log)
    make_llm, prompts, expected, clock, title, extra = setup
    warmup = extra.pop("warmup", None)
    explain = extra.pop("explain", None)
    policies = load.default_policies(method, switch_off_batch=args.switch_off_batch)
    rates = args.rates
    if rates is None:
        single = load.run_load(make_llm(policies[0].speculation), prompts[:1], [0.0], args.max_tokens, clock)
        base = 1.0 / single.latencies[0]
        rates = [base * m for m in (args.rate_multiples or ((0.5, 2, 8, 32, 128) if sim else (0.5, 32)))]
        log(f"one request alone takes {single.latencies[0]:.3f} s: rates {', '.join(f'{r:.3g}' for r in rates)}/s")
    rows = load.sweep(make_llm, policies, prompts, rates, args.requests, args.max_tokens, clock, expected,
                      args.seed, log, warmup=warmup, reps=args.reps, trace_dir=args.trace,
                      warm_policies=args.warm_policies)
    cmp = load.compare(rows)
    print(title)
    print(load.table(rows))
    print()
    print(load.comparison_table(cmp))
    if cmp:
        worst_best = max(c["goodput_vs_best_static"] for c in cmp)
        worst_none = max(c["goodput_vs_none"] for c in cmp)
        print(f"targets: goodput latency <= 1.03 x best static k at every rate: "
              f"{'met' if worst_best <= 1.03 else 'NOT met'} (worst {worst_best:.3f}); "
              f"<= 1/0.97 x no speculation at every rate: {'met' if worst_none <= 1 / 0.97 else 'NOT met'} "
              f"(worst {worst_none:.3f})")
    mismatched = sorted({r["policy"] for r in rows if not r["identical_outputs"]})
    print("greedy outputs identical to plain decoding:", "yes" if not mismatched else f"NO: {mismatched}")
    if mismatched and explain is not None:
        extra["divergences"] = _explain_divergences(rows, explain)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "run"}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"title": title, "settings": settings, "method": method, "rates": rates,
                                         "rows": rows, "comparison": cmp, **extra}, indent=1))
        print(f"wrote {args.json}")
    if args.plot:
        args.plot.mkdir(parents=True, exist_ok=True)
        path = args.plot / ("load_simulated.png" if sim else "load_real.png")
        load.plot(rows, path, title)
        print(f"wrote {path}")
    return 1 if mismatched else 0


def _explain_divergences(rows: list[dict], explain) -> list[dict]:
    """Every distinct first difference from the reference in the sweep, explained by the plain
    target (bench/divergence.py), printed and returned for the JSON."""
    from specd.bench import divergence, load

    found: dict[tuple, dict] = {}
    for r in rows:
        for d in r["divergences"]:
            key = load.divergence_key(d)
            if key not in found:
                found[key] = {"policies": [], **d, **(explain(d["prompt"], d["got"]) or {})}
            found[key]["policies"].append(f"{r['policy']} @ {r['rate']:.3g}/s")
    out = sorted(found.values(), key=lambda x: (x["prompt"], x["position"]))
    ties = sum(1 for x in out if x.get("near_tie"))
    print(f"first differences from the reference: {len(out)}, of which {ties} at near-ties of the plain target "
          f"(the reference's token led by at most {divergence.NEAR_TIE_ULPS:g} ulps of its dtype; rounding, "
          f"not speculation)")
    for x in out:
        if "logit_lead" in x:
            print(f"  prompt {x['prompt']} token {x['position']}: reference {x['expected_token']}, got "
                  f"{x['got_token']} (rank {x['got_rank']}); lead {x['logit_lead']:.4g} logits = "
                  f"{x['lead_ulps']:.3g} {x['dtype']} ulps{'' if x['near_tie'] else ' -- NOT a near-tie'}; "
                  f"in {len(x['policies'])} runs' rows")
    return out


def _fitting(prompts: list, limit: int, log) -> list:
    """The prompts that leave room for the output in the model's context."""
    kept = [(name, ids) for name, ids in prompts if len(ids) <= limit]
    if len(kept) < len(prompts):
        log(f"skipping {len(prompts) - len(kept)} prompts longer than {limit} tokens (the model's context)")
    if not kept:
        from specd.errors import InvalidArgumentError

        raise InvalidArgumentError(f"no built-in prompt fits the model's context with {limit} tokens to spare")
    return kept


def _simulated(args, target, draft, method, log):
    from specd.bench.prompts import load_prompts
    from specd.bench.replay import ReplayWorld, cached_traces, record_traces
    from specd.engine.llm import LLM
    from specd.engine.timer import GPUProfile, HostTime, MeasuredProfile, SyntheticTimer
    from specd.errors import InvalidArgumentError
    from specd.hub import cache_dir
    from specd.models.llama import LlamaModel
    from specd.models.loader import load_model

    t = load_model(target, args.dtype)
    prompts = _fitting([(p.name, list(t.tokenizer(p.text)["input_ids"])) for p in load_prompts(t.tokenizer)],
                       t.config.max_position_embeddings - args.max_tokens - 16, log)
    key = {"target": str(Path(target).resolve()), "draft": str(Path(draft).resolve()) if draft else None,
           "dtype": args.dtype, "max_tokens": args.max_tokens, "prompts": prompts}
    if args.device != "cpu":  # greedy traces can differ between devices (CPU keys stay as they were)
        key["device"] = args.device

    def make():
        log(f"recording greedy traces of {len(prompts)} prompts x {args.max_tokens} tokens on the real models "
            "(once; cached)")
        llm_factory = lambda: LLM(t, dtype=args.dtype, device=args.device, max_num_seqs=len(prompts))  # noqa: E731
        draft_factory = ((lambda: LlamaModel.from_loaded(load_model(draft, args.dtype), args.device)) if draft
                         else None)
        return record_traces(llm_factory, draft_factory, prompts, args.max_tokens, log)

    host = None
    if args.host_ms is not None:
        try:
            host = HostTime.from_ms([float(x) for x in args.host_ms.split(",")])
        except ValueError as e:
            raise InvalidArgumentError(f"--host-ms: {e}") from None
    if args.gpu_profile is not None:  # read before the traces: a bad file fails fast
        profile = MeasuredProfile.load(args.gpu_profile)
    world = ReplayWorld(cached_traces(cache_dir() / "traces", key, make))
    if args.overhead_ms is not None and not args.overhead_ms >= 0:
        raise InvalidArgumentError(f"--overhead-ms must be >= 0, got {args.overhead_ms}")
    if args.gpu_profile is None:
        profile = GPUProfile(target_base=args.target_ms / 1e3, target_knee=args.target_knee,
                             target_per_token=args.target_per_token_us / 1e6, draft_base=args.draft_ms / 1e3,
                             draft_knee=args.draft_knee, draft_per_token=args.draft_per_token_us / 1e6,
                             step_overhead=(0.5 if args.overhead_ms is None else args.overhead_ms) / 1e3)
    elif args.overhead_ms is not None:
        profile = dataclasses.replace(profile, step_overhead=args.overhead_ms / 1e3)
    if host is not None:
        profile = dataclasses.replace(profile, host=host)
    longest = max(len(p) for p in world.prompts) + args.max_tokens + 16
    pages = 2 * args.max_num_seqs * (-(-longest // 16)) + 16
    target_model = world.model("target", max_positions=longest + 64)
    draft_model = world.model("draft", max_positions=longest + 64) if world.has_draft else None

    def make_llm(spec, policy=None):
        return LLM.from_models(target_model, draft_model if "draft" in spec.methods else None, spec,
                               num_kv_pages=pages, max_num_seqs=args.max_num_seqs, timer=SyntheticTimer(profile),
                               policy=policy)

    host_ms = profile.host.to_ms()
    host_text = (f"; host ms per request / drafting request / draft token / draft forward "
                 f"{'/'.join(f'{x:g}' for x in host_ms)}" if any(host_ms) else "")
    costs = (f"forward times MEASURED on a GPU ({profile.source}; step overhead {1e3 * profile.step_overhead:.2f} ms"
             f"{host_text})" if args.gpu_profile is not None else f"SYNTHETIC GPU profile {profile}")
    title = (f"specd bench load --simulated: {costs}; engine decisions replayed from greedy "
             f"traces of {Path(target).name} / {Path(draft).name if draft else '-'} ({len(world.prompts)} prompts); "
             f"{args.requests} requests x {args.max_tokens} tokens per rate; max batch {args.max_num_seqs}; "
             f"method {method}")
    settings = ({"gpu_profile": str(args.gpu_profile), "profile_source": profile.source,
                 "step_overhead_ms": 1e3 * profile.step_overhead, "host_ms": host_ms} if args.gpu_profile is not None
                else {"profile": asdict(profile)})
    return make_llm, world.prompts, world.outputs, "virtual", title, {**settings, "synthetic": True}


def _where(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name(torch.device(device))} ({device})"
    return "this machine's CPU"


def _real(args, target, draft, method, log):
    from specd.bench import divergence
    from specd.bench.prompts import load_prompts
    from specd.engine.llm import LLM
    from specd.engine.params import SamplingParams, SpeculationConfig
    from specd.models.llama import LlamaModel
    from specd.models.loader import check_compatible, load_model

    t = load_model(target, args.dtype)
    d = load_model(draft, args.dtype) if draft is not None else None
    if d is not None:
        check_compatible(t, d)
    # One copy of the weights on the device for every LLM of the sweep.
    target_model = LlamaModel.from_loaded(t, args.device)
    draft_model = LlamaModel.from_loaded(d, args.device) if d is not None else None
    prompts = [ids for _, ids in _fitting([(p.name, list(t.tokenizer(p.text)["input_ids"]))
                                            for p in load_prompts(t.tokenizer)],
                                           t.config.max_position_embeddings - args.max_tokens - 16, log)]
    prompts.sort(key=len)
    # The shortest prompt beyond the timed ones warms every LLM up (untimed), when there is one.
    held_out = prompts[args.requests] if len(prompts) > args.requests else None
    prompts = prompts[:min(len(prompts), args.requests)]

    llms: dict[str, LLM] = {}

    def make_llm(spec, policy=None):
        """One LLM per speculation config, made (and its CUDA graphs captured) on first use,
        untimed; later runs reset it (LLM.reset: a fresh engine and policy, the same pool
        and graphs), so no timed run pays for a capture."""
        key = repr(spec)
        llm = llms.get(key)
        if llm is None:
            llm = LLM.from_models(target_model, draft_model if "draft" in spec.methods else None, spec,
                                  tokenizer=t.tokenizer, device=args.device, max_num_seqs=args.max_num_seqs)
            captured = llm.capture_cuda_graphs()
            if captured["graphs"]:
                log(f"{spec.method_name} k={spec.k} ({spec.policy}): captured {captured['graphs']} CUDA graphs "
                    f"in {captured['seconds']:.1f} s (untimed)")
            llms[key] = llm
        llm.reset(policy)  # every run starts afresh (policy None: a new one from the config)
        return llm

    log(f"reference: plain greedy outputs of {len(prompts)} prompts")
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    reference = LLM.from_models(target_model, None, SpeculationConfig(method="none"), tokenizer=t.tokenizer,
                                device=args.device, max_num_seqs=len(prompts))
    expected = [o.token_ids for o in reference.generate(prompts, params)]
    del reference
    title = (f"specd bench load: real models {Path(target).name} / {Path(draft).name if draft else '-'} on "
             f"{_where(args.device)} (wall clock, dtype {args.dtype}); {args.requests} requests x {args.max_tokens} "
             f"tokens per rate; max batch {args.max_num_seqs}; method {method}")
    if held_out is not None:
        title += f"; each LLM first serves one untimed warm-up request ({len(held_out)}-token held-out prompt)"

    def explain(prompt: int, got: list[int]):
        return divergence.explain(target_model, prompts[prompt], expected[prompt], got)

    return make_llm, prompts, expected, "wall", title, {"synthetic": False, "warmup": held_out, "explain": explain}
