"""``specd bench serve`` (specd/bench/serving.py) against specd's own server on tiny models:
Poisson arrivals, streamed and not, completions and chat; the usage events give exact token
counts; the summary's figures are consistent; an unreachable server is a clear error."""

import json
import math

import pytest

pytest.importorskip("uvicorn", reason="specd[serve] (uvicorn) is not installed")

import specd  # noqa: E402
from specd.bench import serving  # noqa: E402
from specd.cli import main  # noqa: E402
from specd.serve import AsyncLLM, make_app, serving_in_thread  # noqa: E402
from test_engine import self_draft  # noqa: E402
from test_serve import TEMPLATE  # noqa: E402
from tiny_models import make_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def url(tmp_path_factory, tiny_tokenizer_dir):
    """specd serve on a tiny target with a 4,096-token context (every built-in prompt fits)."""
    target = tmp_path_factory.mktemp("bench_serve_target")
    make_tiny_model(target, "llama", tokenizer_dir=tiny_tokenizer_dir, lm_head_scale=10.0, seed=1,
                    max_position_embeddings=4096)
    draft = self_draft(target, tmp_path_factory.mktemp("bench_serve_draft"))
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=3),
                    max_num_seqs=8)
    llm.tokenizer.chat_template = TEMPLATE
    with serving_in_thread(make_app(AsyncLLM(llm), "tiny")) as port:
        yield f"http://127.0.0.1:{port}"


def test_arrivals_are_poisson_and_seeded():
    times = serving.arrival_times(4000, 20.0, seed=3)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times == serving.arrival_times(4000, 20.0, seed=3) and times[0] == 0
    assert abs(sum(gaps) / len(gaps) - 1 / 20) < 0.005  # mean gap 1 / rate
    assert serving.arrival_times(3, math.inf, 0) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("mode", ["completions", "chat", "not streamed"])
def test_bench_serve_measures_the_server(url, tmp_path, capsys, mode):
    out = tmp_path / "serve.json"
    extra = {"completions": [], "chat": ["--chat"], "not streamed": ["--no-stream"]}[mode]
    code = main(["bench", "serve", "--url", url, "--requests", "10", "--max-tokens", "8", "--rates", "inf,40",
                 "--json", str(out), *extra])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "model `tiny`" in printed and "TTFT p50" in printed
    runs = json.loads(out.read_text())["runs"]
    assert [r["config"]["rate"] for r in runs] == [None, 40.0]
    for run in runs:
        s = run["summary"]
        assert s["completed"] == 10 and s["failed"] == 0
        assert s["output_tokens"] == 80 and not s["tokens_estimated"]  # usage events: exact counts
        assert s["requests_per_s"] > 0 and s["output_tokens_per_s"] == pytest.approx(80 / s["duration_s"])
        for r in run["requests"]:
            assert r["ok"] and 0 < r["ttft"] <= r["e2e"] and r["output_tokens"] == 8
        if mode != "not streamed":
            assert s["tpot_ms"]["p50"] > 0 and s["itl_ms"]["p50"] is not None
        else:
            assert all(r["ttft"] == r["e2e"] for r in run["requests"])
    sent = [r["sent"] for r in runs[1]["requests"]]
    assert sent == sorted(sent) and sent[-1] > 0.02  # spread by the arrivals at 40 requests/s
    # specd reports the prompt tokens its prefix cache served: the second run resends the
    # first run's prompts, whose blocks are cached by then.
    first, second = runs[0]["summary"], runs[1]["summary"]
    assert first["prompt_tokens"] == second["prompt_tokens"] > 0
    assert second["cached_prompt_tokens"] > 0
    assert second["prefix_cache_hit_share"] == pytest.approx(second["cached_prompt_tokens"] / second["prompt_tokens"])
    assert "cached" in printed and "%" in printed


def test_bench_serve_sends_the_api_key(models_with_key, capsys, monkeypatch):
    url = models_with_key
    assert main(["bench", "serve", "--url", url, "--requests", "2", "--max-tokens", "4"]) == 2
    assert "HTTP 401" in capsys.readouterr().err
    monkeypatch.setenv("OPENAI_API_KEY", "k3y")
    assert main(["bench", "serve", "--url", url, "--requests", "2", "--max-tokens", "4"]) == 0
    assert main(["bench", "serve", "--url", url, "--requests", "2", "--max-tokens", "4", "--api-key", "nope",
                 "--model", "tiny"]) == 1  # every request refused (401): failed


@pytest.fixture(scope="module")
def models_with_key(tiny_llama_dir):
    """A plain specd server that wants the API key k3y."""
    with serving_in_thread(make_app(AsyncLLM(specd.LLM(tiny_llama_dir)), "tiny", api_key="k3y")) as port:
        yield f"http://127.0.0.1:{port}"


def test_an_unreachable_server_and_rejected_requests_are_clear(url, capsys):
    code = main(["bench", "serve", "--url", "http://127.0.0.1:9", "--requests", "1"])
    assert code == 2 and "cannot reach http://127.0.0.1:9" in capsys.readouterr().err
    code = main(["bench", "serve", "--url", url, "--model", "other", "--requests", "3", "--max-tokens", "4"])
    printed = capsys.readouterr().out
    assert code == 1 and "    0    3 " in printed  # refused by the server (404): counted as failed
    assert main(["bench", "serve", "--url", url, "--kinds", "poems"]) == 2
