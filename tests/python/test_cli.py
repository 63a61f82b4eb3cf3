"""The `specd` command on tiny models built in the test (no downloads): generate, bench
--quick with JSON and PNG output, --help, and clear errors."""

import json
import subprocess
import sys

import pytest


def specd(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "specd.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_llama_dir):
    from test_engine import self_draft

    return tiny_llama_dir, self_draft(tiny_llama_dir, tmp_path_factory.mktemp("cli_draft"))


def test_help_for_every_command():
    for args in ([], ["generate"], ["bench"]):
        r = specd(*args, "--help")
        assert r.returncode == 0 and "usage: specd" in r.stdout
    assert "--show-accepted" in specd("generate", "--help").stdout
    assert "--quick" in specd("bench", "--help").stdout


def test_generate_streams_text_and_reports_metrics(pair):
    target, draft = pair
    r = specd("generate", "def fibonacci(n):", "--target", target, "--draft", draft, "--method", "draft", "-k", "3",
              "--max-tokens", "12", "--dtype", "float32", "--show-accepted")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "\x1b[32m" in r.stdout  # accepted drafts coloured (the self-draft agrees often)
    assert "12 tokens" in r.stderr and "acceptance rate" in r.stderr and "mean accepted length" in r.stderr
    plain = specd("generate", "def fibonacci(n):", "--target", target, "--method", "none", "--max-tokens", "12",
                  "--dtype", "float32")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == r.stdout.replace("\x1b[32m", "").replace("\x1b[0m", "")  # lossless
    tree = specd("generate", "def fibonacci(n):", "--target", target, "--draft", draft, "--method", "draft", "-k", "3",
                 "--draft-tree-width", "2", "--max-tokens", "12", "--dtype", "float32")
    assert tree.returncode == 0, tree.stderr
    assert tree.stdout == plain.stdout  # draft trees: lossless too
    bad = specd("generate", "x", "--target", target, "--method", "ngram", "--draft-tree-width", "2")
    assert bad.returncode == 2 and "draft_tree_width" in bad.stderr


def test_generate_prints_logprobs(pair):
    target, draft = pair
    r = specd("generate", "def fibonacci(n):", "--target", target, "--draft", draft, "--method", "draft", "-k", "3",
              "--max-tokens", "6", "--dtype", "float32", "--logprobs", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.split("[specd] logprobs")[1].splitlines()[1:7]
    assert [int(line.split()[0]) for line in lines] == list(range(6))
    for line in lines:  # greedy: every token is its row's most likely (rank 1), logprob <= 0
        assert float(line.rsplit("  ", 1)[0].split()[-2]) <= 0 and line.rsplit("  ", 1)[0].split()[-1] == "1"
    bad = specd("generate", "x", "--target", target, "--method", "none", "--logprobs", "21")
    assert bad.returncode == 2 and "logprobs must be" in bad.stderr


def test_generate_applies_penalties_losslessly(pair):
    target, draft = pair
    args = ("--max-tokens", "12", "--dtype", "float32", "--repetition-penalty", "1.5", "--frequency-penalty", "1.0",
            "--presence-penalty", "0.5", "--min-tokens", "12")
    spec = specd("generate", "def fibonacci(n):", "--target", target, "--draft", draft, "--method", "draft", "-k",
                 "3", *args)
    plain = specd("generate", "def fibonacci(n):", "--target", target, "--method", "none", *args)
    unpenalised = specd("generate", "def fibonacci(n):", "--target", target, "--method", "none", "--max-tokens", "12",
                        "--dtype", "float32")
    assert spec.returncode == plain.returncode == 0, spec.stderr + plain.stderr
    assert spec.stdout == plain.stdout != unpenalised.stdout
    bad = specd("generate", "x", "--target", target, "--method", "none", "--presence-penalty", "3")
    assert bad.returncode == 2 and "presence_penalty must be" in bad.stderr


def test_generate_follows_a_constraint_losslessly(pair, tmp_path):
    """Under a constraint the draft model, plain decoding and jump-forward decoding print the
    same text."""
    target, draft = pair
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "properties": {"size": {"enum": ["S", "M"]}}, "required": ["size"], '
                      '"additionalProperties": false}')
    for option in (("--choice", "yes", "--choice", "no"), ("--regex", "[0-9]{3}"), ("--json-schema", f"@{schema}")):
        args = ("--max-tokens", "16", "--dtype", "float32", *option)
        spec = specd("generate", "def fibonacci(n):", "--target", target, "--draft", draft, "--method", "draft",
                     "-k", "3", *args)
        plain = specd("generate", "def fibonacci(n):", "--target", target, "--method", "none",
                      "--jump-forward-tokens", "0", *args)
        jump = specd("generate", "def fibonacci(n):", "--target", target, "--method", "none", *args)  # (default 8)
        assert spec.returncode == plain.returncode == jump.returncode == 0, spec.stderr + plain.stderr + jump.stderr
        assert spec.stdout == plain.stdout == jump.stdout
    assert plain.stdout.strip() in ('{"size": "S"}', '{"size": "M"}')
    bad = specd("generate", "x", "--target", target, "--method", "none", "--regex", "([a")
    assert bad.returncode == 2 and "could not be compiled" in bad.stderr
    two = specd("generate", "x", "--target", target, "--method", "none", "--regex", "a", "--json-object")
    assert two.returncode == 2 and "exactly one" in two.stderr
    bad = specd("generate", "x", "--target", target, "--method", "none", "--regex", "a", "--jump-forward-tokens", "-1")
    assert bad.returncode == 2 and "jump_forward_tokens" in bad.stderr and "Traceback" not in bad.stderr


def test_bench_quick_writes_json_and_plots(pair, tmp_path):
    target, draft = pair
    out, plots = tmp_path / "bench.json", tmp_path / "plots"
    r = specd("bench", "--quick", "--reps", "1", "--target", target, "--draft", draft, "--dtype", "float32",
              "--json", out, "--plot", plots)
    assert r.returncode == 0, r.stderr
    assert "identical to specd plain decoding: yes" in r.stdout
    data = json.loads(out.read_text())
    configs = {row["config"] for row in data["rows"]}
    assert configs == {"specd none", "specd draft k=3", "specd ngram k=6", "specd suffix k=6", "hf plain",
                       "hf assisted"}
    for row in data["rows"]:
        assert row["tokens_per_s"] > 0 and row["tokens"] == 16
        assert abs(row["target_share"] + row["draft_share"] + row["other_share"] - 1) < 1e-6 or row["other_share"] == 0
        if row["system"] == "specd":
            assert row["identical_to_plain"] is True
    assert "specd_over_hf_assisted" in data["headline"]
    for name in ("speedup_vs_k.png", "time_breakdown.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_errors_are_clear(pair, tmp_path):
    target, _ = pair
    r = specd("generate", "x", "--target", tmp_path / "missing", "--method", "none")
    assert r.returncode == 2 and "error" in r.stderr and "missing" in r.stderr and "Traceback" not in r.stderr
    r = specd("generate", "x", "--target", target, "--method", "none", "--temperature", "-1")
    assert r.returncode == 2 and "temperature" in r.stderr
    r = specd("generate", "x", "--target", target, "--method", "draft")
    assert r.returncode == 2 and "--draft" in r.stderr
    r = specd("bench", "--target", target, "--reps", "0")
    assert r.returncode == 2 and "--reps" in r.stderr
    assert specd("generate", "x", "--method", "magic").returncode == 2


def test_generate_reports_a_failed_request(pair, monkeypatch, capsys):
    """In process, with NaN planted in the target's logits from the request's second verify:
    the text so far, then one error line and exit status 1."""
    from test_engine import poison_target_rows

    from specd.cli import main

    target, _ = pair
    poison_target_rows(monkeypatch, victim_id=0, from_call=2)
    code = main(["generate", "def fibonacci(n):", "--target", str(target), "--method", "none",
                 "--max-tokens", "12", "--dtype", "float32"])
    err = capsys.readouterr().err
    assert code == 1
    assert "specd generate: error: request 0: verification failed" in err
