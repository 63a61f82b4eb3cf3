"""Serving set-up around the engine: the CLI's --device (auto / cpu / cuda[:N], and a clear
error for a GPU that is not there), LLM.reset (a fresh engine over the same models, KV pool
and CUDA graphs, serving exactly as a new LLM would) and LLM.capture_cuda_graphs (every
graph captured up front, so that no later step captures one)."""

import json

import pytest
import torch

import specd
from specd.engine.timer import GPUProfile, SyntheticTimer
from specd.errors import FailedPreconditionError, InvalidArgumentError
from specd.hardware import resolve_device, resolve_dtype
from test_cli import specd as run_cli
from test_engine import prompts_of_mixed_lengths, self_draft
from test_target_graph import cuda  # noqa: F401  (the GPU fixture: skips without a GPU, saying why)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_llama_dir):
    return tiny_llama_dir, self_draft(tiny_llama_dir, tmp_path_factory.mktemp("setup_draft"))


def test_resolve_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    for missing in ("cuda", "cuda:0"):
        with pytest.raises(InvalidArgumentError, match="sees no CUDA GPU"):
            resolve_device(missing)
    for bad in ("gpu", "cuda:x", "cuda:", "CPU", ""):
        with pytest.raises(InvalidArgumentError, match=r"'auto', 'cpu', 'cuda' or 'cuda:N'"):
            resolve_device(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(InvalidArgumentError, match="has 2 CUDA device"):
        resolve_device("cuda:2")
    assert resolve_dtype("auto", "cuda") == "bfloat16" and resolve_dtype("float32", "cuda") == "float32"


def test_cli_device_errors(tiny_llama_dir):
    r = run_cli("generate", "hi", "--target", tiny_llama_dir, "--method", "none", "--device", "tpu")
    assert r.returncode == 2 and "cuda:N" in r.stderr and "Traceback" not in r.stderr
    if torch.cuda.is_available():
        return  # the refusal of a missing GPU needs a machine without one
    r = run_cli("generate", "hi", "--target", tiny_llama_dir, "--method", "none", "--device", "cuda",
                "--max-tokens", "2")
    assert r.returncode == 2 and "sees no CUDA GPU" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("generate", "hi", "--target", tiny_llama_dir, "--method", "none", "--device", "cpu",
                "--max-tokens", "2", "--dtype", "float32")
    assert r.returncode == 0, r.stderr


def _tokens(outputs):
    return [o.token_ids for o in outputs]


def test_reset_serves_as_a_new_llm_would(pair):
    """After reset, the same requests give what a new LLM gives: the same tokens (sampled
    without a seed, so the streams follow the request ids, which restart), the same goodput
    decisions (the policy forgot what it learned) and the same telemetry."""
    target, draft = pair
    spec = specd.SpeculationConfig(method="draft", num_speculative_tokens="auto")
    timer = SyntheticTimer(GPUProfile())  # reported times are fixed, so decisions are reproducible
    llm = specd.LLM(target, draft, spec, timer=timer, max_num_seqs=4)
    prompts = prompts_of_mixed_lengths(llm.tokenizer)[:5]
    params = specd.SamplingParams(temperature=0.8, max_tokens=12)
    first = _tokens(llm.generate(prompts, params))
    first_metrics = llm.metrics()
    second = _tokens(llm.generate(prompts, params))  # later request ids: other streams
    assert second != first
    pool, target_graph, policy = llm.pool, llm.target_graph, llm.engine.policy
    assert llm.pool.blocks.num_free_pages == llm.pool.blocks.num_pages  # every request gave its pages back
    llm.reset()
    assert llm.pool is pool and llm.target_graph is target_graph and llm.engine.policy is not policy
    assert _tokens(llm.generate(prompts, params)) == first
    assert json.dumps(llm.metrics(), sort_keys=True) == json.dumps(first_metrics, sort_keys=True)
    new = specd.LLM(target, draft, spec, timer=timer, max_num_seqs=4)
    assert _tokens(new.generate(prompts, params)) == first


def test_reset_refuses_requests_in_flight_and_takes_a_policy(pair):
    target, draft = pair
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=3))
    req = llm._make_request(prompts_of_mixed_lengths(llm.tokenizer)[3], specd.SamplingParams(max_tokens=8))
    llm.engine.add(req)
    llm.engine.step()
    with pytest.raises(FailedPreconditionError, match="in flight"):
        llm.reset()
    assert llm.engine.has_work  # the refused reset changed nothing
    llm.engine.abort(req)
    llm.reset("none")
    out = llm.generate([prompts_of_mixed_lengths(llm.tokenizer)[1]], specd.SamplingParams(temperature=0,
                                                                                          max_tokens=6))
    assert out[0].metrics.draft_tokens == 0  # the "none" policy speculates nothing
    with pytest.raises(InvalidArgumentError):
        llm.reset("no-such-policy")


def test_reset_does_not_look_the_policy_up_again(pair, monkeypatch):
    """reset() keeps the configured policy's factory: finding a name means reading every
    installed package's entry points (tens of milliseconds), which a benchmark resetting
    between runs must not pay. A policy named in reset() is still looked up."""
    from specd.engine import policies

    target, draft = pair
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens="auto"))
    first = llm.engine.policy
    monkeypatch.setattr(policies, "entry_points", lambda **_: pytest.fail("entry points read again"))
    llm.reset()
    assert type(llm.engine.policy) is type(first) and llm.engine.policy is not first
    with pytest.raises(pytest.fail.Exception, match="read again"):
        llm.reset("static")


def test_capture_cuda_graphs_is_a_no_op_without_graphs(pair):
    target, draft = pair
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=2))
    assert llm.capture_cuda_graphs()["graphs"] == 0  # CPU: no runners
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=2),
                    draft_graph=True, target_graph=True)  # CPU runners: they never capture
    assert llm.capture_cuda_graphs(sampling=True)["graphs"] == 0
    with pytest.raises(InvalidArgumentError, match="does not capture"):
        llm.target_graph.capture_all()


# ---- GPU ----


def test_gpu_capture_all_then_serving_captures_nothing(pair, cuda):  # noqa: F811
    """Every graph a goodput run replays (any k per request, any catch-up width, every batch
    bucket) is among those capture_cuda_graphs made up front; outputs equal plain decoding."""
    target, draft = pair
    prompts = prompts_of_mixed_lengths(specd.LLM(target).tokenizer)
    params = specd.SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    plain = _tokens(specd.LLM(target, device="cuda", dtype="float32", max_num_seqs=8).generate(prompts, params))
    llm = specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens="auto"),
                    device="cuda", dtype="float32", max_num_seqs=8)
    made = llm.capture_cuda_graphs()
    runners = (llm.draft_graph, llm.target_graph)
    counts = [len(r._graphs) for r in runners]
    assert made["graphs"] == sum(counts) > 0
    assert llm.capture_cuda_graphs()["graphs"] == 0  # all there already
    for batch in (prompts[:1], prompts[:3], prompts):
        assert _tokens(llm.generate(batch, params)) == plain[:len(batch)]
        llm.reset()
    assert [len(r._graphs) for r in runners] == counts  # serving captured nothing new


def test_gpu_cli_bench_load_real_on_cuda(pair, tmp_path, cuda):  # noqa: F811
    target, draft = pair
    r = run_cli("bench", "load", "--target", target, "--draft", draft, "--device", "cuda", "--dtype", "float32",
                "--requests", "4", "--max-tokens", "8", "--rates", "1000", "--max-num-seqs", "4",
                "--json", tmp_path / "real.json")
    assert r.returncode == 0, r.stderr
    assert "greedy outputs identical to plain decoding: yes" in r.stdout
    assert "captured" in r.stderr  # each policy's LLM captured its graphs before timing
    data = json.loads((tmp_path / "real.json").read_text())
    assert data["settings"]["device"] == "cuda" and "(cuda)" in data["title"]
