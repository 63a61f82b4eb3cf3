"""What the HTTP server (specd serve) adds to the engine: the same requests run through
LLM.add_request / LLM.step() directly, then as concurrent clients of the server (uvicorn in
this process, HTTP over loopback), non-streamed and streamed, in one run.

    python bench/serve_overhead.py [--clients 1,8] [--max-tokens 32] [--reps 5] [--json PATH]

SYNTHETIC: tiny random Llama models built in a temporary directory (target 2 layers, a
1-layer draft cut from it), so forwards cost little and what the server adds (HTTP, JSON, the
engine thread's queue, the asyncio hand-off of each step's chunks) is visible; greedy, draft
chains with k = 3. Per case: wall time from the first request sent to the last response read
(median of --reps runs, cases interleaved), generated tokens per second, and the ratio to the
direct run's time. The outputs of every mode are checked to be the same text (exit status 1
otherwise).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def __init__(self):",
           "for i in range(10):\n    print(i)\n", "def add(a, b):\n    return", "x = [1, 2, 3]\nfor",
           "while True:\n    line =", "with open(path) as f:"]


def _models(root: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
    from test_engine import self_draft
    from tiny_models import make_tiny_model, make_tokenizer

    tok = root / "tokenizer"
    make_tokenizer(tok)
    make_tiny_model(root / "target", "llama", tokenizer_dir=tok, seed=1, lm_head_scale=10.0)
    return root / "target", self_draft(root / "target", root / "draft")


def _llm(target: Path, draft: Path, clients: int):
    import specd

    return specd.LLM(target, draft, specd.SpeculationConfig(method="draft", num_speculative_tokens=3),
                     max_num_seqs=max(clients, 1))


def _body(i: int, max_tokens: int, stream: bool) -> dict:
    return {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}


def direct(llm, clients: int, max_tokens: int) -> tuple[float, list[str]]:
    import specd

    t0 = time.perf_counter()
    ids = [llm.add_request(PROMPTS[i % len(PROMPTS)], specd.SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                          ignore_eos=True))
           for i in range(clients)]
    texts = {i: "" for i in ids}
    while llm.has_unfinished_requests():
        for chunk in llm.step():
            texts[chunk.request_id] += chunk.text
    return time.perf_counter() - t0, [texts[i] for i in ids]


def over_http(port: int, clients: int, max_tokens: int, stream: bool) -> tuple[float, list[str]]:
    texts = [""] * clients

    def ask(i: int):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        conn.request("POST", "/v1/completions", json.dumps(_body(i, max_tokens, stream)),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        if not stream:
            texts[i] = json.loads(r.read())["choices"][0]["text"]
        else:
            for line in r:
                if line.startswith(b"data: {"):
                    texts[i] += json.loads(line[6:])["choices"][0]["text"]
        conn.close()
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, texts


def _case(llm_direct, port: int, clients: int, args) -> list[dict]:
    """One client count: every mode warmed up (outputs compared), then --reps interleaved runs."""
    modes = {"direct (LLM.step)": lambda: direct(llm_direct, clients, args.max_tokens),
             "server": lambda: over_http(port, clients, args.max_tokens, False),
             "server, streamed": lambda: over_http(port, clients, args.max_tokens, True)}
    times: dict[str, list[float]] = {m: [] for m in modes}
    outputs = {m: run()[1] for m, run in modes.items()}  # warm-up (and the outputs compared)
    for _ in range(args.reps):
        for m, run in modes.items():
            times[m].append(run()[0])
    base = statistics.median(times["direct (LLM.step)"])
    same = all(o == outputs["direct (LLM.step)"] for o in outputs.values())
    rows = []
    for m in modes:
        med = statistics.median(times[m])
        rows.append({"clients": clients, "mode": m, "ms": med * 1e3, "tokens_per_s": clients * args.max_tokens / med,
                     "ratio_to_direct": med / base, "same_text": same})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="1,8")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    from specd.serve import AsyncLLM, make_app, serving_in_thread

    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = _models(Path(tmp))
        for clients in [int(c) for c in args.clients.split(",")]:
            llm_direct = _llm(target, draft, clients)
            with serving_in_thread(make_app(AsyncLLM(_llm(target, draft, clients)), "tiny")) as port:
                rows_of_case = _case(llm_direct, port, clients, args)
            ok &= all(r["same_text"] for r in rows_of_case)
            rows += rows_of_case
    print(f"SYNTHETIC tiny models: {args.max_tokens} greedy tokens per request, draft chains k = 3, "
          f"median of {args.reps} runs")
    print(f"{'clients':>7} {'mode':<20} {'ms':>9} {'tok/s':>9} {'x direct':>9} same text")
    for r in rows:
        print(f"{r['clients']:>7} {r['mode']:<20} {r['ms']:>9.1f} {r['tokens_per_s']:>9.1f} "
              f"{r['ratio_to_direct']:>9.2f} {'yes' if r['same_text'] else 'NO'}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "max_tokens": args.max_tokens, "reps": args.reps}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
