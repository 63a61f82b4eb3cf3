"""bench/gpu/profile_forwards.py's host-time part on the CPU (tiny models): every step of each
run is timed with its shape, and the fit (the controller's OverheadModel) writes what the
load benchmark's --gpu-profile reads as host_ms."""

import json

import torch

from bench_scripts import load_script
from specd.engine.timer import HostTime, MeasuredProfile


def _load():
    return load_script("bench/gpu/profile_forwards.py")


def test_host_time_by_step_shape_is_measured_and_fitted(tmp_path):
    pf = _load()
    import bench_draft_loop  # on the path while loading: imported by profile_forwards

    torch.manual_seed(0)
    target_cfg, draft_cfg = bench_draft_loop.configs(smoke=True)
    target = bench_draft_loop.random_model(target_cfg, "cpu", torch.float32)
    draft = bench_draft_loop.random_model(draft_cfg, "cpu", torch.float32)
    by_run, steps = pf.step_host_times(target, draft, runs=((0, (1, 3)), (2, (1, 3))), max_tokens=6)
    assert set(by_run) == {"plain, batch 1", "plain, batch 3", "draft k=2, batch 1", "draft k=2, batch 3"}
    assert all(ms > 0 for ms in by_run.values())
    assert all(ms > 0 and shape.requests >= 1 for ms, shape in steps)
    drafting = [shape for _, shape in steps if shape.drafting_requests]
    assert drafting and all(1 <= s.draft_forwards <= 2 and s.draft_tokens <= 2 * s.drafting_requests for s in drafting)
    assert any(s.draft_forwards == 2 for s in drafting)  # k = 2 until max_tokens caps it
    assert any(s.drafting_requests == 0 for _, s in steps)
    constant, host = pf.fit_host_ms(steps)
    assert constant >= 0 and set(host) == {"per_request", "per_drafting_request", "per_draft_token",
                                           "per_draft_forward"}
    assert all(v >= 0 for v in host.values())
    # What a profile with these fields gives the simulated load benchmark.
    profile = {"models": {m: [{"tokens": 1, "ms": 1.0}] for m in ("target", "draft")},
               "step_overhead_ms": constant, "host_ms": host}
    (tmp_path / "p.json").write_text(json.dumps(profile))
    loaded = MeasuredProfile.load(tmp_path / "p.json")
    assert loaded.host == HostTime.from_ms([host[k] for k in ("per_request", "per_drafting_request",
                                                              "per_draft_token", "per_draft_forward")])
