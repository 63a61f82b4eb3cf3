"""bench/serve_overhead.py (the same requests through LLM.step directly and as clients of the
HTTP server, plain and streamed) at a tiny size: it runs, every mode gives the same text (it
returns 1 otherwise), and it writes its JSON."""

import json

import pytest

from bench_scripts import load_script

pytest.importorskip("uvicorn", reason="specd[serve] (uvicorn) is not installed")


def test_serve_overhead_runs_and_agrees(tmp_path, capsys):
    script = load_script("bench/serve_overhead.py")
    out = tmp_path / "serve.json"
    assert script.main(["--clients", "1,3", "--max-tokens", "6", "--reps", "1", "--json", str(out)]) == 0
    assert "SYNTHETIC tiny models" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [(r["clients"], r["mode"]) for r in rows] == [(c, m) for c in (1, 3) for m in
                                                         ("direct (LLM.step)", "server", "server, streamed")]
    assert all(r["same_text"] and r["ms"] > 0 for r in rows)
