"""Host time of an engine step: everything the engine does on the CPU around its model
forwards (scheduling, the policy's decision, proposing, packing the graph runners' inputs,
verification on the host, committing KV, emitting tokens, telemetry), per step and per
request-step, by policy and batch size.

    python bench/host_step.py [--batches 1,16] [--policies none,k2,k4,goodput] [--reps 9]
                              [--tokens 64] [--queue N] [--prefix-caching on|off|on,off] [--json F]

SYNTHETIC forwards: the tiny test model's forward is replaced by a null forward (one-hot
logits of a fixed function of the input token), so the time left is the engine's own. Target
and draft use the same function, so every draft is accepted: each step emits k + 1 tokens per
request, the most host work a step of that k can have. The graph runners run as on a GPU:
their inputs are packed into the fixed buffers and uploaded, then the bodies a GPU would
replay as CUDA graphs (the target's verify forward; the draft's head and forwards 1..k-1,
input preparation and sampling included) run eagerly and are timed as device work, like the
forwards. Not counted: the launch of those graphs on a GPU (a few to tens of microseconds
each, docs/benchmarks.md). Greedy decoding; 300-token prompts of Python source; a tokenizer
(text is made once per request, at its output). On a GPU the host time adds to the forwards'
unless it overlaps them, so it bounds the steps per second a batch can reach.

host ms/step = (wall time of generate - device work) / engine steps, the median of --reps
runs (each after one warm-up generate of the same requests); runs of all cases are
interleaved, so a slow spell of the machine spreads over every case.

--queue N: the serving path instead of generate. Each run adds the batch's requests and N
more through LLM.add_request (max_num_seqs = the batch, so N wait), runs 3 steps (prefill),
then times --tokens - 4 steps of LLM.step() (the batch still running, all N still waiting),
then aborts everything. A server's step should not slow down with its queue.

--prefix-caching: the engine with automatic prefix caching (on, its default), without
(off), or both as separate cases. Each run starts with an empty cache (LLM.reset) and the
prompts share no block, so "on" shows what the cache costs the host when it finds nothing:
sending each step's new tokens to the planner, registering full blocks, the lookups at
admission.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from tiny_models import make_tiny_model, make_tokenizer, stdlib_corpus_files  # noqa: E402

import specd  # noqa: E402

VOCAB = 384


class DeviceClock:
    """Time inside what a GPU would run as device work: the null forwards and the graph
    runners' captured bodies (nested calls counted once)."""

    def __init__(self):
        self.seconds, self.depth = 0.0, 0

    def timed(self, fn):
        def wrapped(*args, **kwargs):
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.depth -= 1

        return wrapped


def null_forward(self, input_ids, meta, kv, logits_indices=None, backend=None, logits_out=None):
    """A LlamaModel.forward stand-in: logits one-hot on (token * 31 + 7) % vocab of each row's
    input token."""
    ids = input_ids if logits_indices is None else input_ids[logits_indices]
    out = torch.zeros(len(ids), VOCAB) if logits_out is None else logits_out[:len(ids)].zero_()
    out[torch.arange(len(ids)), (ids * 31 + 7) % VOCAB] = 1.0
    return out


def speculation(policy: str) -> specd.SpeculationConfig:
    if policy == "none":
        return specd.SpeculationConfig()  # plain decoding
    if policy == "goodput":
        return specd.SpeculationConfig(method="draft", num_speculative_tokens="auto")
    if policy.startswith("k") and policy[1:].isdigit():
        return specd.SpeculationConfig(method="draft", num_speculative_tokens=int(policy[1:]))
    raise SystemExit(f"unknown policy {policy!r}: none, kN (static k = N, draft model) or goodput")


class Case:
    def __init__(self, model_dir: Path, policy: str, batch: int, tokens: int, queue: int = 0,
                 prefix_caching: bool = True):
        spec = speculation(policy)
        draft = str(model_dir) if "draft" in spec.methods else None
        self.policy, self.batch, self.queue, self.tokens = policy, batch, queue, tokens
        self.prefix_caching = prefix_caching
        self.llm = specd.LLM(str(model_dir), draft, spec, dtype="float32", max_num_seqs=batch, num_kv_pages=4096,
                             draft_graph=True if draft else None, target_graph=True,
                             enable_prefix_caching=prefix_caching)
        self.clock = DeviceClock()
        for model in (self.llm.target, self.llm.draft):
            if model is not None:
                model.forward = self.clock.timed(types.MethodType(null_forward, model))
        # The graph runners' captured bodies: one graph replay each on a GPU.
        for runner, bodies in ((self.llm.draft_graph, ("_head", "_forward")), (self.llm.target_graph, ("_forward",))):
            for name in bodies if runner is not None else ():
                setattr(runner, name, self.clock.timed(getattr(runner, name)))
        text = "".join(open(f).read() for f in stdlib_corpus_files()[:3])
        self.prompts = [self.llm.tokenizer(text[2000 * i:2000 * i + 1500])["input_ids"][:300] for i in range(batch)]
        self.params = specd.SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        self.llm.generate(self.prompts, self.params)  # warm-up
        self.runs: list[tuple[float, float, int]] = []

    def run(self) -> None:
        self.llm.reset()
        if self.queue:
            return self._run_serving()
        self.clock.seconds = 0.0
        t0 = time.perf_counter()
        self.llm.generate(self.prompts, self.params)
        wall = time.perf_counter() - t0
        self.runs.append((wall - self.clock.seconds, self.clock.seconds, self.llm.engine.steps))

    def _run_serving(self) -> None:
        llm = self.llm
        ids = [llm.add_request(self.prompts[i % self.batch], self.params) for i in range(self.batch + self.queue)]
        for _ in range(3):  # the prefills
            llm.step()
        steps = max(1, self.tokens - 4)
        self.clock.seconds = 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            llm.step()
        wall = time.perf_counter() - t0
        self.runs.append((wall - self.clock.seconds, self.clock.seconds, steps))
        for rid in ids:
            llm.abort_request(rid)
        while llm.has_unfinished_requests():
            llm.step()

    def row(self) -> dict:
        host = statistics.median(r[0] / r[2] for r in self.runs)
        steps = self.runs[-1][2]
        return {"policy": self.policy, "batch": self.batch, "queue": self.queue, "steps": steps,
                "prefix_caching": self.prefix_caching,
                "host_ms_per_step": 1e3 * host, "host_us_per_request_step": 1e6 * host / self.batch,
                "device_work_ms_per_step": 1e3 * statistics.median(r[1] / r[2] for r in self.runs),
                "host_ms_per_step_min": 1e3 * min(r[0] / r[2] for r in self.runs), "reps": len(self.runs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,16")
    p.add_argument("--policies", default="none,k2,k4,goodput")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--tokens", type=int, default=64, help="max_tokens per request")
    p.add_argument("--queue", type=int, default=0, help="requests waiting behind the batch (serving path)")
    p.add_argument("--prefix-caching", default="on", help="on, off or on,off (both, as separate cases)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    caching = [{"on": True, "off": False}[v] for v in args.prefix_caching.split(",")]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_tokenizer(root / "tok", VOCAB)
        make_tiny_model(root / "model", "qwen2", vocab_size=VOCAB, tokenizer_dir=root / "tok", seed=1)
        cases = [Case(root / "model", policy, int(b), args.tokens, args.queue, c)
                 for b in args.batches.split(",") for policy in args.policies.split(",") for c in caching]
        for _ in range(args.reps):
            for case in cases:
                case.run()
    rows = [c.row() for c in cases]
    print("SYNTHETIC forwards (null; every draft accepted): the engine's host time per step, "
          f"median of {args.reps} interleaved runs, {args.tokens} tokens per request"
          + (f"; serving path, {args.queue} requests waiting" if args.queue else ""))
    print(f"{'policy':8s} {'batch':>5s} {'cache':>5s} {'steps':>5s} {'host ms/step':>12s} {'us/request-step':>15s} "
          f"{'min ms/step':>11s}")
    for r in rows:
        print(f"{r['policy']:8s} {r['batch']:5d} {'on' if r['prefix_caching'] else 'off':>5s} {r['steps']:5d} "
              f"{r['host_ms_per_step']:12.3f} {r['host_us_per_request_step']:15.1f} {r['host_ms_per_step_min']:11.3f}")
    if args.json:
        args.json.write_text(json.dumps({"synthetic": "null forwards", "tokens": args.tokens, "rows": rows},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
