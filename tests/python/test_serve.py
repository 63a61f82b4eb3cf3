"""The OpenAI-compatible server (specd/serve, ``specd serve``) on tiny models: completions and
chat completions, streamed or not, equal plain decoding's text (speculation on the server,
none in the reference); logprobs in both layouts; concurrent requests share the engine's
batch; a disconnecting stream aborts its request; bad requests get 400/404 with the field
named; a request failing in the engine gets 500 (or an error event) while others go on."""

import http.client
import json
import threading
import time

import pytest

fastapi = pytest.importorskip("fastapi", reason="specd[serve] (FastAPI) is not installed")
from fastapi.testclient import TestClient  # noqa: E402

import specd  # noqa: E402
from specd.serve import AsyncLLM, make_app, serving_in_thread  # noqa: E402
from test_engine import poison_target_rows, self_draft  # noqa: E402
from tiny_models import CODE_SNIPPET  # noqa: E402

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
PROMPTS = [CODE_SNIPPET[:60], "for i in range(10):\n    print(i)\n", "def f(a, b):", "import os\n"]


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_llama_dir):
    return tiny_llama_dir, self_draft(tiny_llama_dir, tmp_path_factory.mktemp("serve_draft"))


@pytest.fixture(scope="module")
def plain(models):
    llm = specd.LLM(models[0])
    llm.tokenizer.chat_template = TEMPLATE
    return llm


def _server_llm(models, **kw):
    llm = specd.LLM(models[0], models[1], specd.SpeculationConfig(method="draft", num_speculative_tokens=3), **kw)
    llm.tokenizer.chat_template = TEMPLATE
    return llm


@pytest.fixture(scope="module")
def client(models):
    engine = AsyncLLM(_server_llm(models))
    with TestClient(make_app(engine, "tiny")) as c:
        c.engine = engine
        yield c


def _greedy(plain, prompt, n, **kw):
    return plain.generate([prompt], specd.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw))[0]


def _events(response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            events.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return events


def test_completions_equal_plain_decoding(client, plain):
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 12,
                                             "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    want = _greedy(plain, PROMPTS[0], 12)
    assert body["object"] == "text_completion" and body["model"] == "tiny" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == want.text and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len(want.prompt_token_ids), "completion_tokens": 12,
                             "total_tokens": len(want.prompt_token_ids) + 12,
                             "prompt_tokens_details": {"cached_tokens": body["usage"]["prompt_tokens_details"][
                                 "cached_tokens"]}}
    spec = body["specd"][0]
    assert spec["verify_steps"] >= 1 and spec["draft_tokens"] > 0 and spec["mean_accepted_length"] >= 1


def test_usage_reports_prompt_tokens_from_the_prefix_cache(client, plain):
    """A prompt sent again finds its whole blocks in the prefix cache (all but its last token,
    16-token blocks), plain and streamed, and the text is the same."""
    prompt = " ".join(PROMPTS) * 2
    n = len(plain.tokenizer(prompt)["input_ids"])
    assert n > 40
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    first = client.post("/v1/completions", json=body).json()
    again = client.post("/v1/completions", json=body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    events = _events(client.post("/v1/completions", json={**body, "stream": True,
                                                          "stream_options": {"include_usage": True}}))
    assert events[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16
    assert client.get("/metrics").json()["prefix_cache"]["hit_tokens"] > 0


def test_several_prompts_and_token_ids(client, plain):
    ids = plain.tokenizer(PROMPTS[2])["input_ids"]
    r = client.post("/v1/completions", json={"prompt": [PROMPTS[1], PROMPTS[3]], "max_tokens": 8, "temperature": 0,
                                             "ignore_eos": True})
    assert [c["text"] for c in r.json()["choices"]] == [_greedy(plain, p, 8).text for p in (PROMPTS[1], PROMPTS[3])]
    assert [c["index"] for c in r.json()["choices"]] == [0, 1]
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert r.json()["choices"][0]["text"] == _greedy(plain, ids, 8).text


def test_streamed_completion_is_the_whole_one(client, plain):
    with client.stream("POST", "/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 16, "temperature": 0,
                                                         "ignore_eos": True, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r)
    assert events[-1] == "[DONE]" and len(events) >= 3
    chunks = events[:-1]
    with client.stream("POST", "/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 16, "temperature": 0,
                                                         "ignore_eos": True, "stream": True,
                                                         "stream_options": {"include_usage": True}}) as r:
        with_usage = _events(r)
    assert with_usage[-2]["choices"] == [] and with_usage[-2]["usage"]["completion_tokens"] == 16
    assert "".join(e["choices"][0]["text"] for e in with_usage[:-2]) == "".join(e["choices"][0]["text"] for e in chunks)
    assert "".join(e["choices"][0]["text"] for e in chunks) == _greedy(plain, PROMPTS[1], 16).text
    assert [e["choices"][0]["finish_reason"] for e in chunks] == [None] * (len(chunks) - 1) + ["length"]


def test_completion_logprobs_are_plain_decodings(client, plain):
    r = client.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 10, "temperature": 0,
                                             "ignore_eos": True, "logprobs": 3})
    lp = r.json()["choices"][0]["logprobs"]
    want = _greedy(plain, PROMPTS[0], 10, logprobs=3)
    assert len(lp["token_logprobs"]) == 10 and all(len(t) <= 3 for t in lp["top_logprobs"])
    for got, token, entry in zip(lp["token_logprobs"], want.token_ids, want.logprobs):
        assert abs(got - entry[token].logprob) < 1e-4
    pieces = [len(p) for p in plain.tokenizer.batch_decode([[t] for t in want.token_ids])]
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"]) and len(pieces) == 10


def test_echo_scores_the_prompt(client, plain):
    """echo + logprobs + max_tokens 0 (an evaluation harness's loglikelihood request): the
    prompt's text and its tokens' logprobs, nothing generated; with max_tokens > 0 the
    completion follows."""
    ids = plain.tokenizer(PROMPTS[0])["input_ids"]
    want = plain.generate([PROMPTS[0]], specd.SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True,
                                                             prompt_logprobs=1, logprobs=1))[0]
    r = client.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 0, "echo": True, "logprobs": 1,
                                             "temperature": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == PROMPTS[0] and r.json()["usage"]["completion_tokens"] == 0
    lp = choice["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and len(lp["tokens"]) == len(ids)
    for j in range(1, len(ids)):
        assert abs(lp["token_logprobs"][j] - want.prompt_logprobs[j][ids[j]].logprob) < 1e-4
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 5, "echo": True, "logprobs": 1,
                                             "temperature": 0, "ignore_eos": True})
    choice = r.json()["choices"][0]
    assert choice["text"] == plain.tokenizer.decode(ids) + want.text
    assert len(choice["logprobs"]["tokens"]) == len(ids) + 5
    tail = choice["logprobs"]["token_logprobs"][len(ids):]
    assert all(abs(a - e[t].logprob) < 1e-4 for a, t, e in zip(tail, want.token_ids, want.logprobs))
    whole = choice
    for max_tokens in (5, 0):  # streamed: the same text and logprobs, the prompt's in the first event
        with client.stream("POST", "/v1/completions", json={"prompt": ids, "max_tokens": max_tokens, "echo": True,
                                                             "logprobs": 1, "temperature": 0, "ignore_eos": True,
                                                             "stream": True}) as s:
            events = [e["choices"][0] for e in _events(s)[:-1]]
        lp = {key: [x for e in events for x in e["logprobs"][key]] for key in whole["logprobs"]}
        n = len(ids) + max_tokens
        assert "".join(e["text"] for e in events) == whole["text"][:len(plain.tokenizer.decode(ids))] + (
            want.text if max_tokens else "")
        assert lp["text_offset"] == whole["logprobs"]["text_offset"][:n]
        assert lp["token_logprobs"][1:] == pytest.approx(whole["logprobs"]["token_logprobs"][1:n], abs=1e-6)


def test_chat_equals_plain_decoding_of_the_template(client, plain):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fib(n):"}]
    prompt = plain.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = _greedy(plain, prompt, 10, logprobs=2)
    body = {"messages": messages, "max_tokens": 10, "temperature": 0, "ignore_eos": True, "logprobs": True,
            "top_logprobs": 2}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert r.json()["object"] == "chat.completion"
    assert choice["message"] == {"role": "assistant", "content": want.text}
    content = choice["logprobs"]["content"]
    assert len(content) == 10 and all(len(c["top_logprobs"]) == 2 for c in content)
    assert all(abs(c["logprob"] - e[t].logprob) < 1e-4 for c, t, e in zip(content, want.token_ids, want.logprobs))
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        events = _events(r)[:-1]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"]["content"] for e in events) == want.text
    assert events[-1]["object"] == "chat.completion.chunk" and events[-1]["choices"][0]["finish_reason"] == "length"


def test_n_choices_per_prompt(client, models):
    """Choice i * n + j is prompt i's j-th; with a seed, choice j samples with seed + j (as
    an LLM of the server's configuration does with that seed, alone)."""
    body = {"prompt": [PROMPTS[1], PROMPTS[2]], "max_tokens": 10, "temperature": 1.0, "seed": 11, "n": 3,
            "ignore_eos": True}
    choices = client.post("/v1/completions", json=body).json()["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    alone = _server_llm(models)
    for i, prompt in enumerate((PROMPTS[1], PROMPTS[2])):
        for j in range(3):
            want = alone.generate([prompt], specd.SamplingParams(temperature=1.0, max_tokens=10, seed=11 + j,
                                                                 ignore_eos=True))[0].text
            assert choices[i * 3 + j]["text"] == want
    assert len({c["text"] for c in choices[:3]}) == 3  # distinct samples
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 1.0, "n": 2,
            "seed": 5, "ignore_eos": True}
    r = client.post("/v1/chat/completions", json=chat).json()
    assert [c["index"] for c in r["choices"]] == [0, 1] and len(r["specd"]) == 2
    assert r["usage"]["completion_tokens"] == 12
    with client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as s:
        events = _events(s)[:-1]
    for i in (0, 1):
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant" and all("role" not in c["delta"] for c in mine[1:])
        assert "".join(c["delta"]["content"] for c in mine) == r["choices"][i]["message"]["content"]


def test_a_prompts_choices_share_its_prefill(client):
    """Choices 1..n-1 of a prompt adopt the KV choice 0 computed (the prompt is prefilled
    once): usage counts their whole 16-token blocks as cached, choice 0's none."""
    prompt = "No other test sends this prompt; it is long enough for a few whole blocks of KV. " * 2
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4, "n": 3, "temperature": 1.0,
                                            "seed": 1})
    usage = r.json()["usage"]
    each = usage["prompt_tokens"] // 3
    assert usage["prompt_tokens_details"]["cached_tokens"] == 2 * ((each - 1) // 16 * 16) > 0


def test_penalties_and_seeds_reach_the_engine(client, plain):
    body = {"prompt": PROMPTS[1], "max_tokens": 12, "temperature": 0, "ignore_eos": True, "presence_penalty": 1.5,
            "frequency_penalty": 0.5, "repetition_penalty": 1.2, "logit_bias": {"15": 3.0}, "min_tokens": 4}
    r = client.post("/v1/completions", json=body)
    want = _greedy(plain, PROMPTS[1], 12, presence_penalty=1.5, frequency_penalty=0.5, repetition_penalty=1.2,
                   logit_bias={15: 3.0}, min_tokens=4)
    assert r.json()["choices"][0]["text"] == want.text != _greedy(plain, PROMPTS[1], 12).text
    sampled = {"prompt": PROMPTS[2], "max_tokens": 12, "temperature": 0.9, "seed": 7, "ignore_eos": True}
    texts = {client.post("/v1/completions", json=sampled).json()["choices"][0]["text"] for _ in range(2)}
    assert len(texts) == 1  # same seed, same text


def test_structured_outputs_fields_reach_the_engine(client, plain):
    """OpenAI's response_format, vLLM's structured_outputs object and guided_* fields each
    constrain the output as SamplingParams.structured_outputs does."""
    schema = {"type": "object", "properties": {"size": {"enum": ["S", "M", "L"]}}, "required": ["size"],
              "additionalProperties": False}
    cases = [({"guided_choice": ["yes", "no"]}, specd.StructuredOutputsParams(choice=["yes", "no"])),
             ({"structured_outputs": {"regex": "[0-9]{3}"}}, specd.StructuredOutputsParams(regex="[0-9]{3}")),
             ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}},
              specd.StructuredOutputsParams(json=schema))]
    for fields, so in cases:
        r = client.post("/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 20, "temperature": 0, **fields})
        assert r.status_code == 200, r.text
        want = plain.generate([PROMPTS[1]], specd.SamplingParams(temperature=0, max_tokens=20, structured_outputs=so))
        assert r.json()["choices"][0]["text"] == want[0].text
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "size?"}], "max_tokens": 20,
                                                  "temperature": 0, "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "s", "schema": schema}}})
    assert json.loads(r.json()["choices"][0]["message"]["content"])["size"] in ("S", "M", "L")


@pytest.mark.parametrize("body,status,message", [
    ({"prompt": "x", "guided_regex": "([a"}, 400, "structured_outputs.regex could not be compiled"),
    ({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]}, 400, "give one of response_format"),
    ({"prompt": "x", "response_format": {"type": "xml"}}, 400, "response_format type 'xml'"),
    ({"prompt": "x", "structured_outputs": {"jsn": {}}}, 400, "structured_outputs: "),
    ({"prompt": "x", "temperature": -1}, 400, "temperature must be"),
    ({"prompt": "x", "n": 17}, 400, "n must be an int in [1, 16]"),
    ({"prompt": "x", "best_of": 3}, 400, "best_of is not supported"),
    ({"prompt": "x", "suffix": "y"}, 400, "suffix is not supported"),
    ({"prompt": "x", "logit_bias": {"a": 1}}, 400, "logit_bias keys must be token ids"),
    ({"prompt": "x", "presence_penalty": 5}, 400, "presence_penalty must be"),
    ({"prompt": []}, 400, "prompt is empty"),
    ({"max_tokens": 3}, 400, "invalid request body: body.prompt"),
    ({"prompt": "x", "model": "other"}, 404, "The model `other` does not exist"),
    ({"prompt": "x " * 5000}, 400, "does not fit the context limit"),
])
def test_bad_requests_are_refused_clearly(client, body, status, message):
    r = client.post("/v1/completions", json=body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]
    assert client.engine.num_in_flight == 0  # nothing left queued


def test_chat_errors(client, plain):
    r = client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 3})
    assert r.status_code == 400 and "messages is empty" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})
    assert r.status_code == 400 and "top_logprobs needs logprobs" in r.json()["error"]["message"]
    template, client.engine.llm.tokenizer.chat_template = client.engine.llm.tokenizer.chat_template, None
    try:
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and "has no chat template" in r.json()["error"]["message"]
        client.engine.llm.tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and "the chat template refused the messages" in r.json()["error"]["message"]
        assert "roles must alternate" in r.json()["error"]["message"]
    finally:
        client.engine.llm.tokenizer.chat_template = template


def test_models_health_metrics(client):
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    m = client.get("/metrics").json()
    assert m["requests_in_flight"] == 0 and m["steps"] > 0 and "acceptance_rate" in m


# ---- a real server: concurrency and disconnects ----

@pytest.fixture(scope="module")
def server(models):
    engine = AsyncLLM(_server_llm(models, max_num_seqs=8))
    with serving_in_thread(make_app(engine, "tiny")) as port:
        yield engine, port


def _post(port, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = json.loads(r.read())
    conn.close()
    return r.status, data


def test_concurrent_requests_share_the_batch(server, plain):
    engine, port = server
    before = engine.llm.metrics()
    results = [None] * 6

    def ask(i):
        results[i] = _post(port, "/v1/completions", {"prompt": PROMPTS[i % 4], "max_tokens": 24, "temperature": 0,
                                                     "ignore_eos": True})
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (status, body) in enumerate(results):
        assert status == 200 and body["choices"][0]["text"] == _greedy(plain, PROMPTS[i % 4], 24).text
    after = engine.llm.metrics()
    steps = after["steps"] - before["steps"]
    request_steps = after["verify_request_steps"] - before["verify_request_steps"]
    assert request_steps > steps  # several requests per step: one batch


def test_a_disconnecting_stream_is_aborted(server):
    engine, port = server
    aborted = engine.aborted
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": PROMPTS[0], "max_tokens": 2000, "temperature": 0,
                                                        "ignore_eos": True, "stream": True}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    assert r.readline().startswith(b"data: ")  # generating
    conn.sock.close()
    conn.close()
    deadline = time.time() + 30
    while engine.num_in_flight and time.time() < deadline:
        time.sleep(0.05)
    assert engine.num_in_flight == 0 and engine.aborted == aborted + 1  # aborted, not run to its end
    status, body = _post(port, "/v1/completions", {"prompt": "x", "max_tokens": 2, "temperature": 0})
    assert status == 200  # the server goes on


def test_a_disconnecting_client_aborts_a_whole_response_too(server):
    engine, port = server
    aborted = engine.aborted
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": [PROMPTS[0], PROMPTS[1]], "max_tokens": 2000,
                                                        "temperature": 0, "ignore_eos": True}),
                 {"Content-Type": "application/json"})
    deadline = time.time() + 30
    while engine.num_in_flight < 2 and time.time() < deadline:  # both requests generating
        time.sleep(0.02)
    conn.sock.close()
    conn.close()
    while engine.num_in_flight and time.time() < deadline:
        time.sleep(0.05)
    assert engine.num_in_flight == 0 and engine.aborted == aborted + 2


def test_a_failing_request_gets_500_and_others_go_on(models, plain, monkeypatch):
    poison_target_rows(monkeypatch, victim_id=0, from_call=2)
    engine = AsyncLLM(_server_llm(models))
    with TestClient(make_app(engine, "tiny")) as c:
        r = c.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0,
                                            "ignore_eos": True})
        assert r.status_code == 500 and "request 0" in r.json()["error"]["message"]
        ok = c.post("/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 6, "temperature": 0,
                                             "ignore_eos": True})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == _greedy(plain, PROMPTS[1], 6).text
    engine = AsyncLLM(_server_llm(models))  # request 0 again: poisoned from its first verify on
    with TestClient(make_app(engine, "tiny")) as c:
        with c.stream("POST", "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 12, "stream": True}) as r:
            events = _events(r)
        assert events[-1] == "[DONE]" and "request 0" in events[-2]["error"]["message"]
        assert c.get("/metrics").json()["requests_in_flight"] == 0


def test_specd_serve_command(models, tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target, draft = models
    proc = subprocess.Popen([sys.executable, "-m", "specd.cli", "serve", "--target", str(target), "--draft", str(draft),
                             "--dtype", "float32", "--port", str(port), "--served-model-name", "tiny"],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        status, body = _post(port, "/v1/completions", {"model": "tiny", "prompt": "def f(x):", "max_tokens": 5,
                                                       "temperature": 0})
        assert status == 200 and body["usage"]["completion_tokens"] <= 5
    finally:
        proc.terminate()
        err = proc.communicate(timeout=30)[1]
    assert "serving `tiny`" in err and "policy goodput" in err


def test_gpu_server_equals_plain_decoding(models, plain):
    """On CUDA (graph runners replayed from the engine thread): the server's greedy
    completions equal the CPU's plain decoding, streamed and not, several at once."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    engine = AsyncLLM(_server_llm(models, dtype="float32", device="cuda"))
    with TestClient(make_app(engine, "tiny")) as c:
        r = c.post("/v1/completions", json={"prompt": PROMPTS, "max_tokens": 16, "temperature": 0, "ignore_eos": True})
        assert [ch["text"] for ch in r.json()["choices"]] == [_greedy(plain, p, 16).text for p in PROMPTS]
        with c.stream("POST", "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0,
                                                        "ignore_eos": True, "stream": True}) as s:
            events = _events(s)[:-1]
        assert "".join(e["choices"][0]["text"] for e in events) == _greedy(plain, PROMPTS[0], 16).text


def test_an_api_key_guards_the_v1_routes(models, plain):
    engine = AsyncLLM(_server_llm(models))
    with TestClient(make_app(engine, "tiny", api_key="s3cret")) as c:
        body = {"prompt": PROMPTS[2], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = c.post("/v1/completions", json=body, headers=headers)
            assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        assert c.get("/v1/models").status_code == 401 and c.get("/health").status_code == 200
        r = c.post("/v1/completions", json=body, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == _greedy(plain, PROMPTS[2], 4).text
        assert engine.num_in_flight == 0


def test_serving_in_thread_reports_a_port_in_use(client):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(RuntimeError, match="did not start"):
            with serving_in_thread(fastapi.FastAPI(), port=taken.getsockname()[1], start_timeout_s=10):
                pass
