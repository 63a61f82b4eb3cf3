"""bench/host_step.py runs end to end: rows for every case, host time outside the device work,
and the engine's outputs under null forwards are what they must be (every draft accepted)."""

import json

from bench_scripts import load_script


def _load():
    return load_script("bench/host_step.py")


def test_host_step_bench_reports_every_case(tmp_path):
    out = tmp_path / "host.json"
    assert _load().main(["--batches", "1,2", "--policies", "none,k2", "--reps", "2", "--tokens", "6",
                         "--prefix-caching", "on,off", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["policy"], r["batch"], r["prefix_caching"]) for r in rows] == [
        (p, b, c) for b in (1, 2) for p in ("none", "k2") for c in (True, False)]
    for r in rows:
        assert r["reps"] == 2 and r["host_ms_per_step"] > 0 and r["device_work_ms_per_step"] > 0
        # 6 tokens: one per step without drafts; with k = 2 and every draft accepted, 3 per
        # step (the first step also prefills): 2 steps
        assert r["steps"] == (6 if r["policy"] == "none" else 2)


def test_host_step_bench_serving_path_with_a_queue(tmp_path):
    out = tmp_path / "host.json"
    assert _load().main(["--batches", "2", "--policies", "none", "--reps", "1", "--tokens", "8", "--queue", "5",
                         "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["queue"] == 5 and row["steps"] == 4 and row["host_ms_per_step"] > 0
