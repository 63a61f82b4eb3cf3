"""What structured outputs cost a verify step on the host (engine/structured_outputs.py):
GrammarMasks.apply for a batch of JSON-schema requests, each with a chain of k drafts, on
this machine's device.

    python bench/structured_outputs_cost.py [--batches 1,16,64] [--k 4] [--vocab 151936]
                                            [--reps 9] [--device cpu] [--json PATH]

SYNTHETIC: a vocabulary of --vocab tokens (default Qwen2.5's size): the 256 bytes, then the
most frequent pieces of the Python standard library's source split as Qwen2's pre-tokenizer
splits text (words with their leading space, numbers, punctuation runs), as BPE
vocabularies mostly are; a JSON schema of five fields (string, integer, enum, array of
strings, boolean), compiled as specd compiles JSON (compact); and outputs and drafts drawn at
random among the tokens the grammar allows (so every draft is valid, the most work a step
can have). Each rep first emits k + 1 tokens per request (a step's
accepted drafts and bonus token, fed to the matchers inside the timed call, as in the
engine), then times one ``apply`` over ``[batch x (k + 1), vocab]`` float32 logits: the
matchers' catch-up, one bitmask fill per row (the tree walk), the upload and the masking.
Median ms per step, and µs per row; "fill": of that, the tree walks (xgrammar's bitmask
fills, accept and rollback), the host work a GPU does not take over.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
    "kind": {"enum": ["user", "admin", "guest"]}, "tags": {"type": "array", "items": {"type": "string"}},
    "active": {"type": "boolean"}}, "required": ["name", "age", "kind", "tags", "active"],
    "additionalProperties": False}


def _allowed_tokens(xgr, matcher, vocab: int) -> np.ndarray:
    mask = xgr.allocate_token_bitmask(1, vocab)
    matcher.fill_next_token_bitmask(mask, 0)
    bits = np.unpackbits(mask.numpy().view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits)


def synthetic_vocab(size: int) -> list[bytes]:
    """Token 0 is the end-of-text token, then the 256 bytes, then the most frequent
    pre-tokenized pieces of the standard library's source."""
    import collections
    import os

    import regex
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    split = regex.compile(PRETOKENIZE_REGEX)
    counts: collections.Counter = collections.Counter()
    root = Path(os.__file__).parent
    for path in sorted(root.rglob("*.py")):
        try:
            counts.update(split.findall(path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
        if len(counts) > 4 * size:
            break
    vocab = [b"<|endoftext|>"] + [bytes([b]) for b in range(256)]
    seen = set(vocab)
    for piece, _ in counts.most_common():
        token = piece.encode("utf-8")
        if len(vocab) == size:
            break
        if token not in seen:
            seen.add(token)
            vocab.append(token)
    if len(vocab) < size:
        raise SystemExit(f"the standard library gave only {len(vocab)} distinct pieces, fewer than --vocab {size}")
    return vocab


def measure(batch: int, k: int, grammar, vocab: int, reps: int, device: torch.device, rng) -> dict:
    import xgrammar as xgr

    import specd
    from specd.engine import structured_outputs
    from specd.engine.request import Request
    from specd.engine.structured_outputs import GrammarMasks

    fill_s = [0.0]  # time in the tree walks (bitmask fills), the rest of apply is catch-up and masking
    walk = structured_outputs._fill_tree

    def timed_walk(*args):
        t = time.perf_counter()
        walk(*args)
        fill_s[0] += time.perf_counter() - t
    structured_outputs._fill_tree = timed_walk

    so = specd.StructuredOutputsParams(json=SCHEMA)
    params = specd.SamplingParams(max_tokens=100_000, structured_outputs=so)
    reqs = [Request(i, None, [1, 2, 3], params, 0, i, 1_000_000, frozenset({0})) for i in range(batch)]
    for r in reqs:
        r.grammar = grammar
    walkers = [xgr.GrammarMatcher(grammar) for _ in reqs]  # where each request's output is
    masks = GrammarMasks()
    logits = torch.zeros(batch * (k + 1), vocab, device=device)
    starts = [(k + 1) * i for i in range(batch)]
    times, fills = [], []
    for rep in range(reps + 1):
        trees = []
        for r, w in zip(reqs, walkers):
            for _ in range(k + 1):  # the last step's emitted tokens
                allowed = _allowed_tokens(xgr, w, vocab)
                if w.is_terminated() or allowed.size == 0 or (allowed.size == 1 and allowed[0] == 0):
                    w.reset()  # the object is complete: start another one (a fresh output)
                    masks.release(r.id)
                    r.output_ids.clear()
                    allowed = _allowed_tokens(xgr, w, vocab)
                t = int(rng.choice(allowed[allowed != 0]))
                w.accept_token(t)
                r.output_ids.append(t)
            drafts = []
            for _ in range(k):  # a chain of valid drafts, then back
                allowed = _allowed_tokens(xgr, w, vocab)
                allowed = allowed[allowed != 0]
                if allowed.size == 0:
                    break
                drafts.append(int(rng.choice(allowed)))
                w.accept_token(drafts[-1])
            w.rollback(len(drafts))
            drafts += [1] * (k - len(drafts))
            trees.append(specd.TokenTree.chain(r.output_ids[-1], drafts))
        x = logits.clone()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        errors: dict = {}
        fill_s[0] = 0.0
        masks.apply(x, list(zip(reqs, trees, starts)), errors)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if rep:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
            fills.append(fill_s[0])
        assert not errors, errors
    structured_outputs._fill_tree = walk
    ms = statistics.median(times) * 1e3
    return {"batch": batch, "k": k, "rows": batch * (k + 1), "ms_per_step": ms,
            "us_per_row": 1e3 * ms / (batch * (k + 1)), "ms_min": min(times) * 1e3,
            "fill_us_per_row": 1e6 * statistics.median(fills) / (batch * (k + 1))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import xgrammar as xgr

    device = torch.device(args.device)
    info = xgr.TokenizerInfo(synthetic_vocab(args.vocab), xgr.VocabType.RAW,
                             vocab_size=args.vocab, stop_token_ids=[0])
    # As specd.engine.structured_outputs.GrammarCompiler compiles a JSON schema (compact).
    grammar = xgr.GrammarCompiler(info, max_threads=1).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    rng = np.random.default_rng(0)
    rows = [measure(int(b), args.k, grammar, args.vocab, args.reps, device, rng) for b in args.batches.split(",")]
    print(f"structured outputs, SYNTHETIC JSON-schema requests and {args.vocab}-token vocabulary: "
          f"GrammarMasks.apply per verify step, chains of k = {args.k}, device {args.device}, "
          f"median of {args.reps}")
    print(f"{'batch':>5} {'rows':>5} {'ms/step':>9} {'us/row':>8} {'min ms':>8} {'fill us/row':>12}")
    for r in rows:
        print(f"{r['batch']:5d} {r['rows']:5d} {r['ms_per_step']:9.3f} {r['us_per_row']:8.1f} {r['ms_min']:8.3f} "
              f"{r['fill_us_per_row']:12.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"synthetic": True, "vocab": args.vocab, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
