"""bench/draft_call_host.py runs end to end for chains and trees: one row per case, positive
host times, per step = per call / k."""

import json

from bench_scripts import load_script


def _load():
    return load_script("bench/draft_call_host.py")


def test_draft_call_host_bench_reports_every_case(tmp_path):
    bench = _load()
    for width in (1, 2):
        out = tmp_path / f"host_{width}.json"
        assert bench.main(["--batches", "1,2", "--temperatures", "0,0.8", "--k", "3", "--reps", "2",
                           "--tree-width", str(width), "--json", str(out)]) == 0
        rows = json.loads(out.read_text())["rows"]
        assert [(r["batch"], r["temperature"]) for r in rows] == [(1, 0.0), (1, 0.8), (2, 0.0), (2, 0.8)]
        for r in rows:
            assert r["tree_width"] == width and r["reps"] == 2 and r["host_us_per_call"] > 0
            assert abs(r["host_us_per_step"] - r["host_us_per_call"] / 3) < 0.1
