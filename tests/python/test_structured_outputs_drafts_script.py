"""bench/structured_outputs_drafts.py at a tiny size: it runs, every setting's outputs equal
plain decoding's (it returns 1 otherwise), constrained drafts give more tokens per step than
free ones over the three tasks (without a proposer too: jump-forward), and it writes its JSON."""

import json

import pytest

from bench_scripts import load_script

pytest.importorskip("xgrammar", reason="specd[structured] (xgrammar) is not installed")


def test_structured_outputs_drafts_runs_and_agrees(tmp_path, capsys):
    script = load_script("bench/structured_outputs_drafts.py")
    out = tmp_path / "so.json"
    assert script.main(["--hidden", "64", "--layers", "1", "--reps", "1", "--max-tokens", "12",
                        "--methods", "ngram,draft", "--json", str(out)]) == 0
    assert "SYNTHETIC random models" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert {(r["method"], r["drafts"]) for r in rows} == {("none", "free"), ("none", "constrained")} | {
        (m, s) for m in ("ngram", "draft") for s in ("constrained", "unforced", "free")}
    assert all(r["same_output"] for r in rows)
    for method in ("none", "ngram", "draft"):  # over the three tasks ("none": jump-forward)
        per_step = {s: sum(r["tokens_per_step"] for r in rows if (r["method"], r["drafts"]) == (method, s))
                    for s in ("constrained", "free")}
        assert per_step["constrained"] > per_step["free"], (method, per_step)
