"""`specd bench load` and the trace replay behind --simulated, on tiny models (no downloads):
replayed runs reproduce the real engine's outputs and acceptance exactly; the CLI writes
valid JSON and PNG in both modes; Poisson arrivals have the asked rate."""

import json

import numpy as np
import pytest

import specd
from specd.bench import load
from specd.bench.replay import ReplayWorld, record_traces
from specd.engine.policies import make_policy
from specd.engine.policy_trace import TracedPolicy, first_difference, forward_times, load_trace, replay
from specd.engine.timer import GPUProfile, SyntheticTimer
from specd.models.llama import LlamaModel
from specd.models.loader import load_model
from test_cli import specd as run_cli
from test_engine import greedy, prompts_of_mixed_lengths

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def world(tiny_llama_dir, tiny_llama_draft_dir):
    tok = specd.LLM(tiny_llama_dir).tokenizer
    prompts = [(f"p{i}", ids) for i, ids in enumerate(prompts_of_mixed_lengths(tok))]
    traces = record_traces(lambda: specd.LLM(tiny_llama_dir, max_num_seqs=8),
                           lambda: LlamaModel.from_loaded(load_model(tiny_llama_draft_dir, "float32")),
                           prompts, MAX_TOKENS, log=lambda m: None)
    return ReplayWorld(traces), [ids for _, ids in prompts]


def test_replay_reproduces_the_real_engine(world, tiny_llama_dir, tiny_llama_draft_dir):
    w, prompts = world
    for method in ("draft", "ngram"):
        spec = specd.SpeculationConfig(method=method, num_speculative_tokens=3)
        real = specd.LLM(tiny_llama_dir, tiny_llama_draft_dir if method == "draft" else None, spec)
        real_outs = real.generate(prompts, greedy(max_tokens=MAX_TOKENS))
        replay = specd.LLM.from_models(w.model("target"), w.model("draft") if method == "draft" else None, spec,
                                       num_kv_pages=512)
        replay_outs = replay.generate(w.prompts, greedy(max_tokens=MAX_TOKENS))
        assert [o.token_ids for o in replay_outs] == w.outputs
        # The same drafts are accepted at the same steps: acceptance is replayed exactly.
        assert [o.metrics.accepted_per_position for o in replay_outs] == \
            [o.metrics.accepted_per_position for o in real_outs], method
        assert [o.metrics.verify_steps for o in replay_outs] == [o.metrics.verify_steps for o in real_outs]
    # A static policy on the replay spends exactly the modelled time per forward.
    timer = SyntheticTimer(GPUProfile())
    llm = specd.LLM.from_models(w.model("target"), None, specd.SpeculationConfig(), num_kv_pages=512, timer=timer)
    llm.generate(w.prompts[:1], greedy(max_tokens=MAX_TOKENS))
    t = llm.engine.timings
    assert t.target_forward_s == pytest.approx(0.020 * t.steps)  # every forward below the knee


def test_run_load_on_the_virtual_clock(world):
    w, _ = world
    spec = specd.SpeculationConfig(method="none")
    llm = specd.LLM.from_models(w.model("target"), None, spec, num_kv_pages=512, max_num_seqs=1,
                                timer=SyntheticTimer(GPUProfile(step_overhead=0.0)))
    # Two requests far apart, one at a time: latency = its own steps, no queueing.
    res = load.run_load(llm, w.prompts[:1], [0.0, 100.0], MAX_TOKENS, "virtual", w.outputs[:1])
    assert res.identical and len(res.latencies) == 2
    assert res.latencies[0] == pytest.approx(0.020 * MAX_TOKENS) == pytest.approx(res.latencies[1])
    # The run's own steps split by phase (the profile: 20 ms per target forward, no overhead).
    summary = res.summary()
    assert res.steps == 2 * MAX_TOKENS and summary["steps"] == res.steps
    assert summary["target_ms_per_step"] == pytest.approx(20.0) and summary["draft_ms_per_step"] == 0.0
    assert summary["other_ms_per_step"] == pytest.approx(0.0, abs=1e-9)
    llm = specd.LLM.from_models(w.model("target"), None, spec, num_kv_pages=512, max_num_seqs=1,
                                timer=SyntheticTimer(GPUProfile(step_overhead=0.003)))
    llm.generate(w.prompts[:1], greedy(max_tokens=4))  # earlier steps are not the run's
    res = load.run_load(llm, w.prompts[:1], [0.0], MAX_TOKENS, "virtual", w.outputs[:1])
    assert res.steps == MAX_TOKENS and res.summary()["other_ms_per_step"] == pytest.approx(3.0)
    # Both at once with a batch limit of 1: the second waits for the first.
    llm = specd.LLM.from_models(w.model("target"), None, spec, num_kv_pages=512, max_num_seqs=1,
                                timer=SyntheticTimer(GPUProfile(step_overhead=0.0)))
    res = load.run_load(llm, w.prompts[:1], [0.0, 0.0], MAX_TOKENS, "virtual", w.outputs[:1])
    assert sorted(res.latencies) == pytest.approx([0.020 * MAX_TOKENS, 0.040 * MAX_TOKENS])
    with pytest.raises(ValueError):
        load.run_load(llm, w.prompts[:1], [0.0], MAX_TOKENS, "sundial")


def test_sweep_warms_every_llm_up_untimed(world):
    """warmup: each policy's LLM serves the held-out prompt once before its arrivals; the
    timed rows are unchanged in shape (its latency is not counted) and outputs stay exact."""
    w, _ = world
    made = []

    def make_llm(spec):
        llm = specd.LLM.from_models(w.model("target"), None, spec, num_kv_pages=512, max_num_seqs=2,
                                    timer=SyntheticTimer(GPUProfile(step_overhead=0.0)))
        made.append(llm)
        return llm

    policies = [load.PolicySpec("none", specd.SpeculationConfig(method="none"))]
    rows = load.sweep(make_llm, policies, w.prompts[:2], [1.0], 2, MAX_TOKENS, "virtual", w.outputs[:2],
                      log=lambda m: None, warmup=w.prompts[2])
    assert len(rows) == 1 and rows[0]["requests"] == 2 and rows[0]["identical_outputs"]
    assert len(made) == 1 and made[0]._next_id == 3  # request ids handed out: the warm-up + 2 timed


def test_sweep_repetitions_report_the_median_run(world):
    """reps: every policy runs reps times with a fresh LLM, interleaved across policies; the row
    is the run of median mean latency and lists every run's mean latency."""
    w, _ = world
    made = []
    speeds = iter([1.0, 1.0, 3.0, 3.0, 2.0, 2.0])  # per LLM made: policy A then B, three rounds

    def make_llm(spec):
        scale = next(speeds)
        llm = specd.LLM.from_models(w.model("target"), None, spec, num_kv_pages=512, max_num_seqs=2,
                                    timer=SyntheticTimer(GPUProfile(target_base=0.01 * scale, step_overhead=0.0)))
        made.append(spec.policy)
        return llm

    policies = [load.PolicySpec("none", specd.SpeculationConfig(method="none")),
                load.PolicySpec("none again", specd.SpeculationConfig(method="none"))]
    rows = load.sweep(make_llm, policies, w.prompts[:2], [1.0], 2, MAX_TOKENS, "virtual", w.outputs[:2],
                      log=lambda m: None, reps=3)
    assert len(made) == 6 and len(rows) == 2
    for row in rows:
        runs = row["latency_mean_s_runs"]
        assert row["reps"] == 3 and len(runs) == 3 and row["identical_outputs"]
        assert runs[1] > runs[2] > runs[0]  # the machine "slowed" in round 2, less in round 3
        assert row["latency_mean_s"] == runs[2]  # the median run
    with pytest.raises(ValueError, match="reps"):
        load.sweep(make_llm, policies, w.prompts[:2], [1.0], 2, MAX_TOKENS, "virtual", reps=0)


def test_sweep_rotates_the_policy_order_per_repetition(world):
    """Each round starts len(policies)/reps policies further on, so no policy always runs first
    or last in a round."""
    w, _ = world
    made = []

    def make_llm(spec):
        made.append(spec.k)
        return specd.LLM.from_models(w.model("target"), None, spec, num_kv_pages=512, max_num_seqs=2,
                                     timer=SyntheticTimer(GPUProfile(step_overhead=0.0)))

    policies = [load.PolicySpec(f"ngram k={k}", specd.SpeculationConfig(method="ngram", num_speculative_tokens=k))
                for k in (1, 2, 3)]
    rows = load.sweep(make_llm, policies, w.prompts[:2], [1.0], 2, MAX_TOKENS, "virtual", w.outputs[:2],
                      log=lambda m: None, reps=3)
    assert made == [1, 2, 3, 2, 3, 1, 3, 1, 2]
    assert [r["policy"] for r in rows] == ["ngram k=1", "ngram k=2", "ngram k=3"]  # rows stay in policy order


def test_sweep_keeps_warm_policies_across_runs(world, tmp_path):
    """warm_policies: one policy object per spec for the whole sweep, so what the goodput
    controller measured in earlier runs is still there in later ones (here: every target
    forward of every run is in its cost model); the default gives every run a new policy."""
    w, _ = world
    spec = specd.SpeculationConfig(method="ngram", num_speculative_tokens="auto", policy="goodput")
    policies = [load.PolicySpec("goodput", spec)]
    for warm in (True, False):
        made = []

        def make_llm(s, policy=None):
            llm = specd.LLM.from_models(w.model("target"), None, s, num_kv_pages=512, max_num_seqs=2,
                                        timer=SyntheticTimer(GPUProfile(step_overhead=0.0)), policy=policy)
            made.append(llm)
            return llm

        trace = tmp_path / f"warm{warm}"
        rows = load.sweep(make_llm, policies, w.prompts[:2], [1.0, 8.0], 2, MAX_TOKENS, "virtual", w.outputs[:2],
                          log=lambda m: None, reps=2, trace_dir=trace, warm_policies=warm)
        assert len(made) == 4 and all(r["identical_outputs"] for r in rows)
        inner = [llm.engine.policy.inner for llm in made]  # each run's TracedPolicy wraps the policy
        steps = [llm.engine.timings.steps for llm in made]
        if warm:
            assert all(p is inner[0] for p in inner)
            assert inner[0].costs["target"].samples == sum(steps)
        else:
            assert len({id(p) for p in inner}) == 4
            assert [p.costs["target"].samples for p in inner] == steps
        assert all(load_trace(f)["warm"] is warm for f in trace.glob("*.json"))


def test_divergences_from_the_reference_are_recorded_and_explained(world, tiny_llama_dir):
    """A run records each differing request's first difference; divergence.explain runs the
    plain target over the shared prefix and reports how far the reference's token led there
    (a real lead here: the 'produced' token is the runner-up)."""
    from specd.bench import divergence
    from specd.cli.bench_load import _explain_divergences

    _, prompts = world
    llm = specd.LLM(tiny_llama_dir, dtype="float32", max_num_seqs=2)
    model = llm.target
    reference = [o.token_ids for o in llm.generate(prompts[:2], greedy(max_tokens=MAX_TOKENS))]
    prompt, out = prompts[1], reference[1]
    for j in (0, 5, len(out) - 1):  # the forward agrees with the engine's greedy decoding
        assert int(divergence.next_token_logits(model, prompt + out[:j]).argmax()) == out[j]
    logits = divergence.next_token_logits(model, prompt + out[:3])
    runner_up = int(logits.topk(2).indices[1])
    got = out[:3] + [runner_up] + out[4:]
    x = divergence.explain(model, prompt, out, got)
    assert x["position"] == 3 and x["expected_token"] == out[3] and x["got_token"] == runner_up
    assert x["expected_is_argmax"] and x["got_rank"] == 1 and x["dtype"] == "float32"
    assert x["logit_lead"] == pytest.approx(float(logits[out[3]] - logits[runner_up]))
    assert x["logit_lead"] > 0 and x["lead_ulps"] > 1e3 and not x["near_tie"]  # float32: far from a tie
    assert divergence.explain(model, prompt, out, out) is None
    assert divergence.first_difference([1, 2], [1, 2, 3]) == 2 and divergence.first_difference([1], [1]) is None
    assert load.divergence_key({"prompt": 2, "position": 0, "got": []}) == (2, 0, ())  # an output that ended first

    # run_load: the request of prompt 1 differs from a doctored reference at token 3.
    expected = [list(o) for o in reference]
    expected[1][3] = runner_up
    res = load.run_load(llm, prompts[:2], [0.0, 0.0], MAX_TOKENS, "wall", expected)
    assert not res.identical and res.divergences == [{"prompt": 1, "position": 3, "got": out[:4]}]
    rows = [{**res.summary(), "policy": "none"}]
    explained = _explain_divergences(rows, lambda i, g: divergence.explain(model, prompts[i], expected[i], g))
    assert len(explained) == 1 and explained[0]["policies"] == ["none @ 0/s"]
    assert explained[0]["logit_lead"] == pytest.approx(-x["logit_lead"])  # the doctored token was the runner-up


def test_poisson_arrivals_have_the_asked_rate():
    t = np.asarray(load.poisson_arrivals(50.0, 20001, seed=3))
    assert t[0] == 0 and np.all(np.diff(t) >= 0)
    assert np.mean(np.diff(t)) == pytest.approx(1 / 50.0, rel=0.03)


def check_report(path, png, synthetic):
    data = json.loads(path.read_text())
    assert data["synthetic"] is synthetic
    policies = {r["policy"] for r in data["rows"]}
    assert {"none", "static k=1", "static k=2", "static k=4", "static k=8", "goodput"} <= policies
    assert any(p.startswith("switch_off") for p in policies)
    assert len(data["rows"]) == len(policies) * len(data["rates"])
    assert all(r["identical_outputs"] for r in data["rows"])
    for r in data["rows"]:
        assert 0 < r["latency_p50_s"] <= r["latency_p99_s"] and r["throughput_tok_s"] > 0
    assert [c["rate"] for c in data["comparison"]] == sorted(data["rates"])
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_simulated_and_real(tiny_llama_dir, tiny_llama_draft_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECD_CACHE", str(tmp_path / "cache"))
    r = run_cli("bench", "load", "--simulated", "--target", tiny_llama_dir, "--draft", tiny_llama_draft_dir,
                "--requests", "6", "--max-tokens", "10", "--rates", "2,1000", "--max-num-seqs", "4",
                "--json", tmp_path / "sim.json", "--plot", tmp_path, "--trace", tmp_path / "traces")
    assert r.returncode == 0, r.stderr
    assert "SYNTHETIC" in r.stdout and "goodput/best static" in r.stdout
    traces = sorted((tmp_path / "traces").glob("*.json"))
    assert len(traces) == 2 * 7  # 2 rates x 7 policies, one repetition
    gp = load_trace(tmp_path / "traces" / "rate1_goodput_rep0.json")
    assert gp["policy"] == "goodput" and gp["rate"] == 1000 and gp["speculation"]["policy"] == "goodput"
    assert gp["timed_from"] == 0  # no warm-up on the virtual clock
    assert first_difference(replay(gp["events"], make_policy("goodput", specd.SpeculationConfig(
        **gp["speculation"])))) is None
    check_report(tmp_path / "sim.json", tmp_path / "load_simulated.png", synthetic=True)
    assert list((tmp_path / "cache" / "traces").glob("traces-*.json"))  # recorded once, cached
    r = run_cli("bench", "load", "--target", tiny_llama_dir, "--method", "ngram", "--requests", "3",
                "--max-tokens", "6", "--rates", "1000", "--max-num-seqs", "3", "--dtype", "float32",
                "--json", tmp_path / "real.json", "--plot", tmp_path, "--trace", tmp_path / "real_traces")
    assert r.returncode == 0, r.stderr
    gp = load_trace(tmp_path / "real_traces" / "rate0_goodput_rep0.json")
    assert 0 < gp["timed_from"] < len(gp["events"])  # the warm-up request comes first
    # Wall-clock decisions replay exactly: the trace holds the measured times.
    assert first_difference(replay(gp["events"], make_policy("goodput", specd.SpeculationConfig(
        **gp["speculation"])))) is None
    check_report(tmp_path / "real.json", tmp_path / "load_real.png", synthetic=False)
    bad = run_cli("bench", "load", "--simulated", "--target", tiny_llama_dir, "--rates", "0,-1")
    assert bad.returncode == 2 and "rates must be positive" in bad.stderr
    bad = run_cli("bench", "load", "--target", tiny_llama_dir, "--method", "draft", "--requests", "2")
    assert bad.returncode == 2 and "needs --draft" in bad.stderr


def _traced_goodput(w, method, width=1, timer=None):
    spec = specd.SpeculationConfig(method=method, num_speculative_tokens="auto", draft_tree_width=width)
    traced = TracedPolicy(make_policy("goodput", spec))
    llm = specd.LLM.from_models(w.model("target"), w.model("draft") if "draft" in method else None, spec,
                                num_kv_pages=512, max_num_seqs=4, policy=traced,
                                timer=timer or SyntheticTimer(GPUProfile()))
    return spec, traced, llm


@pytest.mark.parametrize("method,width", [("draft", 1), ("suffix", 1), ("draft", 2), ("draft+ngram", 1)])
def test_policy_trace_replays_the_goodput_controller_exactly(world, method, width):
    """A TracedPolicy records every call; a fresh goodput policy fed the trace decides the same
    k, proposer and node sets with the same predictions, call for call; wrapping changes
    nothing the engine does."""
    w, _ = world
    spec, traced, llm = _traced_goodput(w, method, width)
    outs = llm.generate(w.prompts, greedy(max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == w.outputs
    calls = {e["call"] for e in traced.events}
    assert {"decide", "observe", "observe_forward", "observe_step", "observe_load", "forget"} <= calls
    assert ("size_trees" in calls) == (width > 1)
    assert ("observe_tree" in calls) == (method != "draft" or width > 1)  # trees learn their calibration
    times = forward_times(traced.events)
    assert sum(map(len, times.values())) == sum(e["call"] == "observe_forward" for e in traced.events)
    assert {m for m, _ in times} == ({"target", "draft"} if "draft" in method else {"target"})
    assert all(t > 0 for ts in times.values() for t in ts)
    decided = [d for e in traced.events if e["call"] == "decide" for d in e["decisions"]]
    assert any(k > 0 for k, _, _ in decided) and any(k == 0 for k, _, _ in decided)

    replayed = replay(traced.events, make_policy("goodput", spec))
    assert len(replayed) == sum(e["call"] in ("decide", "size_trees") for e in traced.events)
    assert first_difference(replayed) is None
    assert all(r.recorded == r.replayed for r in replayed)  # predictions too, to the bit

    # The same run without the wrapper: identical decisions per request and step.
    plain = specd.LLM.from_models(w.model("target"), w.model("draft") if "draft" in method else None, spec,
                                  num_kv_pages=512, max_num_seqs=4, timer=SyntheticTimer(GPUProfile()))
    again = plain.generate(w.prompts, greedy(max_tokens=MAX_TOKENS))
    assert [o.metrics.k_per_step for o in again] == [o.metrics.k_per_step for o in outs]


def test_policy_trace_shows_where_another_policy_decides_differently(world, tmp_path):
    """Replaying into a different policy reports the calls whose decisions differ; a trace
    round-trips through JSON; hooks the wrapped policy lacks are absent on the wrapper."""
    w, _ = world
    spec, traced, llm = _traced_goodput(w, "draft")
    llm.generate(w.prompts[:4], greedy(max_tokens=MAX_TOKENS))
    traced.save(tmp_path / "t.json", policy="goodput")
    data = load_trace(tmp_path / "t.json")
    assert data["policy"] == "goodput" and data["events"] == json.loads(json.dumps(traced.events))
    static = make_policy("static", specd.SpeculationConfig(method="draft", num_speculative_tokens=8))
    replayed = replay(data["events"], static)
    diff = first_difference(replayed)
    assert diff is not None and diff.call == "decide"
    assert [d[0] for d in diff.replayed] != [d[0] for d in diff.recorded]
    assert all(d[0] == 8 or d[0] <= r["k_max"] for d, r in zip(diff.replayed, data["events"][diff.index]["requests"]))

    bare = TracedPolicy(static)
    for hook in ("observe_step", "observe_load", "observe_overhead", "observe_tree", "size_trees", "metrics",
                 "wants_node_probs"):
        assert not hasattr(bare, hook), hook
    full = TracedPolicy(make_policy("goodput", spec))
    assert all(callable(getattr(full, h)) for h in ("observe_step", "observe_load", "observe_overhead",
                                                    "size_trees", "metrics"))
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(specd.InvalidArgumentError, match="not a policy trace"):
        load_trace(tmp_path / "bad.json")
    with pytest.raises(specd.InvalidArgumentError, match="unknown call"):
        replay([{"call": "teleport"}], static)


# ---- a measured GPU profile in place of the knee model ----


def _profile_json(path, target_points, draft_points, overhead_ms=0.4):
    points = lambda pts: [{"batch": 1, "query": n, "tokens": n, "context": 256, "ms": ms} for n, ms in pts]  # noqa: E731
    path.write_text(json.dumps({"meta": {"device": "TEST GPU", "weights": "made up for the test"},
                                "models": {"target": points(target_points), "draft": points(draft_points)},
                                "step_overhead_ms": overhead_ms}))
    return path


def test_measured_profile_interpolates_the_measured_times(tmp_path):
    from specd.engine.timer import MeasuredProfile

    path = _profile_json(tmp_path / "p.json", [(1, 10.0), (4, 10.0), (8, 12.0), (8, 14.0), (64, 40.0)], [(2, 3.0)])
    p = MeasuredProfile.load(path)
    assert p.tokens["target"] == (1, 4, 8, 64)  # 8 measured twice: the median
    assert p.seconds("target", 1) == p.seconds("target", 3) == pytest.approx(0.010)
    assert p.seconds("target", 8) == pytest.approx(0.013)
    assert p.seconds("target", 36) == pytest.approx(0.013 + 0.027 / 2)  # between 8 and 64
    assert p.seconds("target", 120) == pytest.approx(0.040 + 0.027 * 56 / 56)  # the last segment's slope
    assert p.seconds("draft", 1) == p.seconds("draft", 50) == pytest.approx(0.003)  # one point: flat
    assert p.step_overhead == pytest.approx(0.0004) and "TEST GPU" in p.source
    timer = SyntheticTimer(p)
    assert timer.forward("target", 8, lambda: "ran") == ("ran", pytest.approx(0.013))
    assert timer.step_seconds(0.02) == pytest.approx(0.0204)
    for bad, message in (({"models": {"target": []}, "step_overhead_ms": 1}, "no measured points for the target"),
                         ({"models": {}}, "KeyError"),
                         ({"models": {"target": [{"tokens": 0, "ms": 1}], "draft": [{"tokens": 1, "ms": 1}]},
                           "step_overhead_ms": 1}, "tokens >= 1")):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(specd.errors.InvalidArgumentError, match=message):
            MeasuredProfile.load(tmp_path / "bad.json")
    with pytest.raises(specd.errors.InvalidArgumentError, match="cannot read the GPU profile"):
        MeasuredProfile.load(tmp_path / "missing.json")


def test_host_time_by_step_shape_in_synthetic_profiles(tmp_path):
    """HostTime: the synthetic host time a step's shape adds to the constant step overhead,
    from a profile's host_ms or given per profile; bad values are errors."""
    from specd.engine.timer import HostTime, MeasuredProfile

    path = _profile_json(tmp_path / "p.json", [(1, 10.0)], [(1, 3.0)])
    data = json.loads(path.read_text())
    data["host_ms"] = {"per_request": 0.02, "per_drafting_request": 0.1, "per_draft_token": 0.01,
                       "per_draft_forward": 0.15}
    path.write_text(json.dumps(data))
    p = MeasuredProfile.load(path)
    assert p.host.to_ms() == pytest.approx([0.02, 0.1, 0.01, 0.15])
    timer = SyntheticTimer(p)
    shape = specd.StepShape(requests=8, drafting_requests=4, draft_tokens=12, draft_forwards=3)
    assert timer.step_seconds(0.02, shape) == pytest.approx(0.02 + 0.0004 + (8 * 0.02 + 0.4 + 0.12 + 0.45) / 1e3)
    assert timer.step_seconds(0.02) == pytest.approx(0.0204)  # no shape: the constant alone
    knee = SyntheticTimer(GPUProfile(step_overhead=0.001, host=HostTime.from_ms([0, 1, 0, 0])))
    assert knee.step_seconds(0.0, shape) == pytest.approx(0.005)
    del data["host_ms"]["per_draft_forward"]
    path.write_text(json.dumps(data))
    with pytest.raises(specd.InvalidArgumentError, match="host_ms needs"):
        MeasuredProfile.load(path)
    with pytest.raises(specd.InvalidArgumentError, match=">= 0"):
        HostTime(per_draft_token=-1e-3)
    with pytest.raises(specd.InvalidArgumentError, match="4 values"):
        HostTime.from_ms([1, 2])


def test_traces_record_step_shapes_and_old_traces_replay(tmp_path):
    """A trace's observe_overhead events carry the step's shape, and a fresh goodput policy
    learns the same host-time model from them on replay; traces written before shapes (the
    seconds alone) still replay, and a plugin with the old one-argument hook is fed the
    seconds."""
    spec = specd.SpeculationConfig(method="ngram", num_speculative_tokens="auto")
    traced = TracedPolicy(make_policy("goodput", spec))
    traced.observe_overhead(0.002, specd.StepShape(4, 2, 6, 0))
    traced.observe_overhead(0.001, specd.StepShape(4, 0, 0, 0))
    assert traced.events == [{"call": "observe_overhead", "seconds": 0.002, "shape": [4, 2, 6, 0]},
                             {"call": "observe_overhead", "seconds": 0.001, "shape": [4, 0, 0, 0]}]
    fresh = make_policy("goodput", spec)
    replay(traced.events, fresh)
    assert fresh.overhead.coefficients == pytest.approx(traced.inner.overhead.coefficients)
    assert fresh.overhead.predict(4, 2, 6, 0) == pytest.approx(0.002, rel=1e-4)
    old = make_policy("goodput", spec)
    replay([{"call": "observe_overhead", "seconds": 0.003}], old)  # no shape: the constant term
    assert old.overhead.predict(16, 8, 40, 4) == pytest.approx(0.003, rel=1e-4)

    class OldStyle(specd.NoSpeculation):
        seen = []

        def observe_overhead(self, seconds):
            self.seen.append(seconds)

    wrapped = TracedPolicy(OldStyle())
    wrapped.observe_overhead(0.004, specd.StepShape(2, 1, 3, 0))
    replay(wrapped.events, OldStyle())
    assert OldStyle.seen == [0.004, 0.004]


def test_measured_profile_prices_attention_per_sequence(tmp_path):
    """A profile with single-sequence prefills separates a per-token base from the attention's
    time per attended key, so a forward of several prompts costs what they attend, not what
    one prompt of as many tokens would."""
    from specd.engine.timer import MeasuredProfile, causal_keys

    per_key_ms = 1e-4
    base_ms = lambda n: 3.0 + 0.01 * max(0, n - 64)  # noqa: E731  flat, then linear
    point = lambda b, q, c: {"batch": b, "query": q, "context": c, "tokens": b * q,  # noqa: E731
                             "ms": base_ms(b * q) + per_key_ms * b * causal_keys(c, q)}
    points = [point(1, n, 0) for n in (128, 256, 512, 1024)] + [point(b, 1, 256) for b in (1, 8, 64)]
    p = MeasuredProfile.from_points({"target": points, "draft": points[:2]}, 0.5)
    assert p.per_key["target"] == pytest.approx(per_key_ms / 1e3)
    assert p.per_key["draft"] == 0.0  # two prefill sizes cannot separate the terms
    one_prompt = p.seconds("target", 1024, causal_keys(0, 1024))
    assert one_prompt == pytest.approx(point(1, 1024, 0)["ms"] / 1e3)  # a measured shape: its time
    four_prompts = p.seconds("target", 1024, 4 * causal_keys(0, 256))
    assert four_prompts == pytest.approx((base_ms(1024) + per_key_ms * 4 * causal_keys(0, 256)) / 1e3)
    assert four_prompts < 0.5 * one_prompt
    assert p.seconds("target", 8, 8 * causal_keys(300, 1)) == pytest.approx((base_ms(8) + per_key_ms * 8 * 301) / 1e3)
    assert p.seconds("target", 1024) == pytest.approx(one_prompt)  # no keys: the raw measured times
    assert SyntheticTimer(p).forward("target", 1024, lambda: None, 4 * causal_keys(0, 256))[1] == four_prompts
    with pytest.raises(specd.errors.InvalidArgumentError, match="batch x query = tokens"):
        MeasuredProfile.from_points({"target": [dict(point(2, 4, 0), tokens=5)], "draft": points}, 0.5)


def test_engine_times_forwards_by_the_keys_they_attend(world):
    """The engine tells its timer every forward's attended keys (timer.causal_keys): a prefill
    of several prompts is the sum of each prompt's causal triangle; a decode step, each
    request's history plus its new tokens; draft forwards likewise."""
    from specd.engine.timer import causal_keys

    w, _ = world

    class Recording(SyntheticTimer):
        def __init__(self):
            super().__init__(GPUProfile(step_overhead=0.0))
            self.calls = []

        def forward(self, model, tokens, fn, keys=None):
            self.calls.append((model, tokens, keys))
            return super().forward(model, tokens, fn, keys)

    prompts = w.prompts[:2]
    timer = Recording()
    llm = specd.LLM.from_models(w.model("target"), w.model("draft"),
                                specd.SpeculationConfig(method="draft", num_speculative_tokens=2),
                                num_kv_pages=512, timer=timer)
    llm.generate(prompts, greedy(max_tokens=4))
    lengths = [len(p) for p in prompts]
    # Step 1 (static k = 2): the draft catches up on each whole prompt, then feeds each request
    # its first draft (position L: L + 1 keys); the target prefills each prompt but its last
    # token (positions 0 .. L-2) and verifies the root and 2 drafts (positions L-1 .. L+1).
    assert timer.calls[:3] == [("draft", sum(lengths), sum(causal_keys(0, n) for n in lengths)),
                               ("draft", 2, sum(n + 1 for n in lengths)),
                               ("target", sum(lengths) - 2 + 6,
                                sum(causal_keys(0, n - 1) + causal_keys(n - 1, 3) for n in lengths))]
    assert all(keys is not None and keys >= tokens for _, tokens, keys in timer.calls)


def test_cli_simulated_with_a_measured_gpu_profile(tiny_llama_dir, tiny_llama_draft_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECD_CACHE", str(tmp_path / "cache"))
    profile = _profile_json(tmp_path / "gpu.json", [(1, 8.0), (16, 8.5), (64, 12.0)], [(1, 2.0), (64, 3.0)])
    r = run_cli("bench", "load", "--simulated", "--target", tiny_llama_dir, "--draft", tiny_llama_draft_dir,
                "--requests", "6", "--max-tokens", "10", "--rates", "2,1000", "--max-num-seqs", "4",
                "--gpu-profile", profile, "--json", tmp_path / "sim.json")
    assert r.returncode == 0, r.stderr
    assert "MEASURED on a GPU" in r.stdout and "TEST GPU" in r.stdout and "SYNTHETIC GPU profile" not in r.stdout
    data = json.loads((tmp_path / "sim.json").read_text())
    assert data["settings"]["gpu_profile"] == str(profile) and data["step_overhead_ms"] == pytest.approx(0.4)
    assert data["synthetic"] is True and "TEST GPU" in data["profile_source"]
    bad = run_cli("bench", "load", "--simulated", "--target", tiny_llama_dir, "--gpu-profile", tmp_path / "nope.json")
    assert bad.returncode == 2 and "cannot read the GPU profile" in bad.stderr


def test_cli_rate_multiples(tiny_llama_dir, tmp_path, monkeypatch):
    """--rate-multiples: rates as multiples of the measured single-request rate (here with
    --warm-policies, recorded in the settings)."""
    monkeypatch.setenv("SPECD_CACHE", str(tmp_path / "cache"))
    r = run_cli("bench", "load", "--simulated", "--target", tiny_llama_dir, "--method", "ngram", "--requests", "3",
                "--max-tokens", "6", "--rate-multiples", "1,4", "--max-num-seqs", "3", "--json", tmp_path / "m.json",
                "--warm-policies")
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "m.json").read_text())
    rates = out["rates"]
    assert len(rates) == 2 and rates[1] == pytest.approx(4 * rates[0])
    assert out["settings"]["warm_policies"] is True
    bad = run_cli("bench", "load", "--simulated", "--target", tiny_llama_dir, "--rates", "1", "--rate-multiples", "2")
    assert bad.returncode == 2 and "not both" in bad.stderr
