"""bench/prefix_cache.py at a tiny size: it runs every workload with and without the cache,
outputs agree (it returns 1 otherwise), cached runs find their shared tokens and the
uncached ones none, and it writes its JSON."""

import json

from bench_scripts import load_script


def test_prefix_cache_bench_runs_and_agrees(tmp_path, capsys):
    script = load_script("bench/prefix_cache.py")
    out = tmp_path / "prefix.json"
    assert script.main(["--hidden", "64", "--layers", "2", "--system", "40", "--question", "6", "--requests", "3",
                        "--turns", "3", "--max-tokens", "5", "--reps", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "SYNTHETIC random models and token ids" in text and "identical" in text
    rows = json.loads(out.read_text())["rows"]
    assert {(r["workload"], r["method"], r["cache"]) for r in rows} == {
        (w, m, c) for w in ("shared system prompt", "chat", "nothing shared") for m in ("none", "draft")
        for c in (True, False)}
    by = {(r["workload"], r["method"], r["cache"]): r for r in rows}
    for m in ("none", "draft"):
        # Requests 2 and 3 find the 40-token system prompt's two full 16-token blocks.
        assert by[("shared system prompt", m, True)]["cached_tokens"] == 2 * 32
        assert by[("chat", m, True)]["cached_tokens"] > 0
        assert by[("nothing shared", m, True)]["cached_tokens"] == 0
        assert all(by[(w, m, False)]["cached_tokens"] == 0 for w in ("shared system prompt", "chat"))
    assert all(r["same_output"] and r["seconds"] > 0 for r in rows)
