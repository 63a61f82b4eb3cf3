"""bench/structured_outputs_cost.py at a tiny size: it runs, times every batch, and writes
its JSON (its own assertions check that no drafted step made a matcher refuse a token)."""

import json

from bench_scripts import load_script


def test_structured_outputs_cost_runs(tmp_path, capsys):
    out = tmp_path / "so.json"
    assert load_script("bench/structured_outputs_cost.py").main(
        ["--batches", "1,3", "--vocab", "2048", "--reps", "2", "--json", str(out)]) == 0
    assert "SYNTHETIC JSON-schema requests and 2048-token vocabulary" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["rows"]) for r in rows] == [(1, 5), (3, 15)]
    assert all(r["ms_per_step"] > 0 and r["us_per_row"] > 0 for r in rows)
