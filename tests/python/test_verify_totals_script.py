"""bench/verify_totals.py (stochastic verification with and without the rows' totals) on the
CPU at a small size: it runs, both forms give the same outputs (it returns 1 otherwise), and
the acceptance knob works (all accepted chains accept drafts; rejected ones accept none)."""

from bench_scripts import load_script, mean_accepted


def test_verify_totals_runs_and_agrees(capsys):
    script = load_script("bench/verify_totals.py")
    args = ["--batch", "6", "--k", "3", "--vocab", "500", "--reps", "1"]
    assert script.main(args + ["--accept", "1"]) == 0
    text = capsys.readouterr().out
    assert "outputs equal: True" in text and "row totals given" in text and mean_accepted(text) > 0
    assert script.main(args + ["--accept", "0"]) == 0
    assert mean_accepted(capsys.readouterr().out) == 0
