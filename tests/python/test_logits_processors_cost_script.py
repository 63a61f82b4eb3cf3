"""bench/logits_processors_cost.py (penalised rows processed the CPU's way and the GPU's way)
at a small vocabulary: it runs, both ways give the same rows (it returns 1 otherwise), and it
writes its JSON."""

import json

from bench_scripts import load_script


def test_logits_processors_cost_runs_and_agrees(tmp_path, capsys):
    script = load_script("bench/logits_processors_cost.py")
    out = tmp_path / "cost.json"
    assert script.main(["--batches", "1,3", "--vocab", "6000", "--prompt", "40", "--output", "60", "--reps", "2",
                        "--json", str(out)]) == 0
    assert "SYNTHETIC penalised requests on cpu" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 3] and all(r["same_rows"] for r in rows)
