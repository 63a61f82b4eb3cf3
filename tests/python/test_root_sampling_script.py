"""bench/root_sampling.py (draft-less sampled steps: verification of the root against
``sample_tokens`` with either draw) on the CPU at a small vocabulary: it runs, checks that
``sample_tokens``' inverse-CDF draw gives verification's tokens, and writes its JSON."""

import json

from bench_scripts import load_script


def test_root_sampling_runs_and_writes_json(tmp_path, capsys):
    script = load_script("bench/root_sampling.py")
    out = tmp_path / "roots.json"
    assert script.main(["--batches", "1,3", "--vocab", "300", "--reps", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "verify root ms" in text and "tokens differ" not in text
    rows = json.loads(out.read_text())["rows"]
    assert [(r["params"], r["batch"]) for r in rows] == [("temperature 0.8", 1), ("temperature 0.8", 3),
                                                         ("top-p 0.9", 1), ("top-p 0.9", 3)]
    assert all(r["tokens_differing"] == 0 and r["gumbel_ms"] > 0 for r in rows)
