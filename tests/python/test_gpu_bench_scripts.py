"""run.sh's bench stage programs (bench/gpu/bench_kernels.py, bench/gpu/bench_draft_loop.py)
run through on the CPU references (--smoke-cpu: tiny float32 cases) with no failed case and
write their JSON. The seventh GPU session lost its draft-loop rows to a draft-call option the
script's probes did not pass on: a smoke run shows such breaks before a GPU is lent."""

import json

from bench_scripts import REPO, load_script


def test_bench_kernels_runs_every_case_on_the_cpu(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench" / "gpu"))  # its cases import neighbours when they run
    script = load_script("bench/gpu/bench_kernels.py")
    assert script.main(["--smoke-cpu", "--quick", "--out", str(tmp_path)]) == 0
    assert "FAILED" not in capsys.readouterr().out
    rows = json.loads((tmp_path / "bench_kernels.json").read_text())
    assert rows


def test_bench_draft_loop_runs_every_mode_on_the_cpu(tmp_path, capsys):
    script = load_script("bench/gpu/bench_draft_loop.py")
    assert script.main(["--smoke-cpu", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and " 0 failed" in out
    assert json.loads((tmp_path / "bench_draft_loop.json").read_text())


def test_divergences_name_the_first_differing_token_and_plain_decodings_margin_there():
    from types import SimpleNamespace

    from specd.engine.logprobs import Logprob

    script = load_script("bench/gpu/bench_draft_loop.py")
    top = [{5: Logprob(-0.1, 1), 6: Logprob(-0.4, 2)}, {7: Logprob(-0.50, 1), 8: Logprob(-0.52, 2)}]
    plain = [SimpleNamespace(token_ids=[5, 7], logprobs=top), SimpleNamespace(token_ids=[5, 7], logprobs=top),
             SimpleNamespace(token_ids=[5, 7, 9], logprobs=top + [{9: Logprob(0.0, 1)}])]
    got = script.divergences([[5, 8], [5, 7], [5, 7]], plain)
    assert [(d["request"], d["index"]) for d in got] == [(0, 1), (2, 2)]
    assert abs(got[0]["top2_gap"] - 0.02) < 1e-9 and got[1]["top2_gap"] is None


def test_batch_invariance_compares_every_product_against_its_row_alone(tmp_path, capsys):
    script = load_script("bench/gpu/batch_invariance.py")
    out = tmp_path / "bi.json"
    assert script.main(["--smoke-cpu", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["products"]) == set(script.SMOKE_PRODUCTS)
    for product in result["products"].values():
        diffs = product["max_abs_diff_by_rows"]
        assert set(map(int, diffs)) == set(script.ROWS)
        assert diffs["1"] == 0.0  # the row alone against itself
        assert all(d < 1e-5 for d in diffs.values())  # rounding, not another result
    # The attention's CPU reference computes each query alone: the same bits at every shape.
    assert set(result["attention"]) == {"tree_attention"}
    assert set(result["attention"]["tree_attention"]) == {f"{b}x{q}" for b, q in script.ATTENTION_SHAPES}
    assert all(d == 0.0 for d in result["attention"]["tree_attention"].values())
    assert "every product and the attention batch-invariant: " in capsys.readouterr().out


def test_run_sh_dry_run_plans_every_stage_and_imports_the_scripts(tmp_path):
    """bench/gpu/run.sh --dry-run (no GPU needed): the shell script parses, prints its plan, and
    the benchmark programs it calls import and print theirs."""
    import os
    import subprocess

    env = {**os.environ, "OUT": str(tmp_path)}
    r = subprocess.run(["bash", str(REPO / "bench" / "gpu" / "run.sh"), "--dry-run"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for stage in ("build :", "ctest :", "pytest:", "bench :", "batch_invariance.py", "wheels:"):
        assert stage in r.stdout, stage
    assert r.stdout.count("dry run: imports ok") == 2  # bench_kernels.py and bench_draft_loop.py
