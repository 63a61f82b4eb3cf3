"""bench/kv_compact_step.py (a step's tree-path KV moves: per request with copy_slots against
one kv_compact per model) on the CPU at small batches: it runs, both ways leave the same bytes
(it returns 1 otherwise), and it writes its JSON."""

import json

from bench_scripts import load_script


def test_kv_compact_step_runs_and_agrees(tmp_path, capsys):
    script = load_script("bench/kv_compact_step.py")
    out = tmp_path / "kv.json"
    assert script.main(["--batches", "1,3", "--reps", "1", "--json", str(out)]) == 0
    assert "SYNTHETIC tree paths" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 3] and all(r["same_bytes"] for r in rows)
