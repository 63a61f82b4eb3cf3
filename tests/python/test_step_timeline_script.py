"""bench/gpu/step_timeline.py: the GPU's idle intervals inside engine steps are attributed to
the innermost host label running in them (synthetic intervals), and the script runs on the
CPU (--smoke-cpu), both draft modes giving the same outputs."""

import json

import pytest

from bench_scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("bench/gpu/step_timeline.py")


def test_idle_time_goes_to_the_innermost_label(script):
    steps = [(0.0, 100.0)]
    gpu = [(10.0, 30.0), (25.0, 40.0), (70.0, 90.0)]  # busy 10-40 and 70-90: idle 0-10, 40-70, 90-100
    labels = [("step", 0.0, 100.0), ("propose", 0.0, 50.0), ("graph launch", 5.0, 8.0),
              ("accept", 45.0, 65.0), ("settle", 95.0, 99.0)]
    assert script.merge(gpu) == [(10.0, 40.0), (70.0, 90.0)]
    assert script.idle_within((0.0, 100.0), script.merge(gpu)) == [(0.0, 10.0), (40.0, 70.0), (90.0, 100.0)]
    out = script.summarize(steps, gpu, labels)
    assert out["steps"] == 1 and out["step_us"] == 100.0
    assert out["gpu_busy_us_per_step"] == 50.0 and out["gpu_idle_us_per_step"] == 50.0
    # 0-5 propose, 5-8 launch, 8-10 propose, 40-45 propose, 45-50 accept (shorter than propose),
    # 50-65 accept, 65-70 and 90-95 and 99-100 unlabelled, 95-99 settle
    assert out["idle_us_per_step_by_phase"] == {"accept": 20.0, "propose": 12.0, script.UNLABELLED: 11.0,
                                                "settle": 4.0, "graph launch": 3.0}
    # the whole step by phase: propose 0-5, 8-45 (42), launch 3, accept 45-65, then unlabelled 65-95 and 99-100
    assert out["host_us_per_step_by_phase"] == {"propose": 42.0, script.UNLABELLED: 31.0, "accept": 20.0,
                                                "settle": 4.0, "graph launch": 3.0}


def test_step_timeline_runs_on_the_cpu(script, tmp_path, capsys):
    out = tmp_path / "timeline.json"
    assert script.main(["--smoke-cpu", "--batches", "1,2", "--tokens", "6", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["device_drafts"]) for r in rows] == [(1, False), (1, True), (2, False), (2, True)]
    assert all(r["steps"] > 0 and r["step_us"] > 0 for r in rows)
    assert "read drafts" in rows[0]["idle_us_per_step_by_phase"]
    assert "host read" in capsys.readouterr().out
