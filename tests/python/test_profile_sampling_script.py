"""bench/gpu/profile_sampling.py (the run.sh profile stage's program) on the CPU: every case
runs on the CPU references at a tiny vocabulary, --dry-run lists them, and an unknown case is
refused by name."""

import pytest

from bench_scripts import load_script


def test_every_case_runs_on_the_cpu_references(capsys):
    script = load_script("bench/gpu/profile_sampling.py")
    assert script.main(["--smoke-cpu"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name}: ran on the CPU reference" in out for name in script.CASES)
    assert script.main(["--dry-run", "--cases", "draft_row"]) == 0
    assert "sample_tokens_and_probs 1 x 151936 bf16" in capsys.readouterr().out
    assert script.main(["--smoke-cpu", "--time", "--reps", "2", "--calls", "1", "--cases", "greedy,draft_row"]) == 0
    out = capsys.readouterr().out
    assert "greedy: " in out and "draft_row: " in out and "us per call (median of 2 runs of 1)" in out
    assert script.main(["--smoke-cpu", "--time", "--graph", "--reps", "1", "--calls", "1", "--cases", "top_p"]) == 0
    assert "top_p: " in (out := capsys.readouterr().out) and "CUDA graph" not in out  # no graph on the CPU
    assert script.main(["--smoke-cpu", "--time", "--reps", "0"]) == 2
    with pytest.raises(SystemExit):
        script.main(["--cases", "nope"])
    assert "unknown cases ['nope']" in capsys.readouterr().err
