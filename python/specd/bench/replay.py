"""Trace replay: the real pair's greedy behaviour, recorded once, replayed by stand-in models
so that the load benchmark can run the engine's real scheduler, proposers, verification and
speculation policies for thousands of steps on a 2-core machine (``specd bench load
--simulated``; step times then come from a synthetic GPU profile, see specd.engine.timer).

Recording (:func:`record_traces`): for each prompt, the target's greedy continuation T (specd
plain decoding) and, teacher-forced over prompt + T, the draft's greedy prediction of every
next token (one draft forward per prompt). For greedy decoding that is all the acceptance
behaviour there is: a draft chain proposed after an on-trace prefix is accepted exactly up
to the first position where the draft's prediction differs from T (the draft sees its own
accepted drafts, which equal T's tokens).

Replay (:class:`ReplayModel`): a model with the engine's forward interface whose KV cache
holds, per token, a hash of the token prefix ending there (read through the block table
and the tree mask exactly as attention reads K/V). Its "logits" are one-hot on the recorded
next token of that prefix (T for the target, the draft's prediction for the draft), or on
the unknown token 0 off the trace (only rejected branches go there). Tokens are renumbered
into a compact vocabulary (1..V) so that logits stay small.

Only greedy decoding can be replayed (stochastic acceptance depends on full distributions).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from specd.models.attention import AttentionMetadata, LayerKV
from specd.models.config import ModelConfig

HASH_BITS = 48             # prefix hashes, stored exactly as two 24-bit halves in float32 KV
_MASK = (1 << HASH_BITS) - 1
_HALF = 1 << 24
_SEED = 0x5EC0DE
UNKNOWN = 0                # compact id predicted off the trace


@dataclass
class Trace:
    """One prompt's recorded greedy behaviour (real token ids)."""

    name: str
    prompt: list[int]
    output: list[int]        # the target's greedy continuation
    draft_next: list[int]    # [len(prompt) + len(output) - 1]: draft's greedy prediction of token i+1

    def to_json(self) -> dict:
        return {"name": self.name, "prompt": self.prompt, "output": self.output, "draft_next": self.draft_next}

    @staticmethod
    def from_json(d: dict) -> "Trace":
        return Trace(d["name"], list(d["prompt"]), list(d["output"]), list(d["draft_next"]))


def prefix_hash(parent: int, token: int) -> int:
    """Hash of a token prefix from its parent prefix's hash (an FNV-style mix)."""
    return ((parent ^ (token + 1)) * 0x100000001B3 + 0x9E3779B1) & _MASK


def _hashes(tokens: Sequence[int]) -> list[int]:
    h, out = _SEED, []
    for t in tokens:
        h = prefix_hash(h, t)
        out.append(h)
    return out


@torch.inference_mode()
def draft_predictions(model, ids: list[int]) -> list[int]:
    """The model's greedy next-token prediction at every position of ``ids`` (teacher-forced,
    one forward through a private one-sequence KV pool)."""
    from specd.engine.model_runner import Segment, forward
    from specd.kv_cache import KVCachePool, KVModel

    pool = KVCachePool([KVModel("draft", model.config, model.dtype)],
                       num_pages=-(-len(ids) // 16) + 1, target_block_size=16, device=model.device)
    pool.blocks.add_sequence(0)
    slots = np.asarray(pool.blocks.reserve(0, len(ids), model=0).slots, dtype=np.int64)
    seg = Segment(0, torch.tensor(ids, dtype=torch.int64), torch.arange(len(ids), dtype=torch.int64), slots,
                  len(ids), None, logits_from=0)
    return forward(model, pool, 0, [seg]).argmax(dim=-1).tolist()


def record_traces(llm_factory: Callable[[], object], draft_factory: Optional[Callable[[], object]],
                  prompts: Sequence[tuple[str, list[int]]], max_tokens: int,
                  log: Callable[[str], None] = print) -> list[Trace]:
    """Greedy target continuations (batched specd plain decoding) and teacher-forced draft
    predictions for ``prompts`` (name, token ids). ``llm_factory()`` -> a specd.LLM without
    speculation; ``draft_factory()`` -> the draft LlamaModel (None: no draft predictions)."""
    from specd.engine.params import SamplingParams

    llm = llm_factory()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([ids for _, ids in prompts], params)
    log(f"recorded {len(outs)} target continuations of {max_tokens} tokens")
    del llm
    draft = draft_factory() if draft_factory is not None else None
    traces = []
    for (name, ids), out in zip(prompts, outs):
        seq = ids + out.token_ids
        nxt = draft_predictions(draft, seq[:-1]) if draft is not None else []
        traces.append(Trace(name, list(ids), list(out.token_ids), nxt))
    return traces


def cached_traces(cache_dir: Path, key: dict, make: Callable[[], list[Trace]]) -> list[Trace]:
    """Traces from ``cache_dir`` under a hash of ``key``, recorded by ``make()`` when absent."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"traces-{digest}.json"
    if path.exists():
        return [Trace.from_json(d) for d in json.loads(path.read_text())["traces"]]
    traces = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "traces": [t.to_json() for t in traces]}))
    tmp.replace(path)
    return traces


class ReplayWorld:
    """The traces in a compact vocabulary, with next-token tables for target and draft."""

    def __init__(self, traces: Sequence[Trace]):
        ids = sorted({t for tr in traces for t in tr.prompt + tr.output + tr.draft_next})
        self.compact = {t: i + 1 for i, t in enumerate(ids)}  # 0 = UNKNOWN
        self.vocab_size = len(ids) + 1
        self.target_next: dict[int, int] = {}
        self.draft_next: dict[int, int] = {}
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []
        for tr in traces:
            prompt = [self.compact[t] for t in tr.prompt]
            output = [self.compact[t] for t in tr.output]
            seq = prompt + output
            hashes = _hashes(seq)
            for i in range(len(prompt) - 1, len(seq) - 1):
                self.target_next[hashes[i]] = seq[i + 1]
                if tr.draft_next:
                    self.draft_next[hashes[i]] = self.compact[tr.draft_next[i]]
            self.prompts.append(prompt)
            self.outputs.append(output)
        self.has_draft = all(tr.draft_next for tr in traces)

    def model(self, which: str, max_positions: int = 8192) -> "ReplayModel":
        return ReplayModel(self.target_next if which == "target" else self.draft_next, self.vocab_size,
                           max_positions)


class ReplayModel:
    """A stand-in model that replays a next-token table (see the module docstring)."""

    window = None
    dtype = torch.float32
    device = torch.device("cpu")

    def __init__(self, table: dict[int, int], vocab_size: int, max_positions: int):
        self.table = table
        # 1 layer, 1 KV head of 2 floats: the two 24-bit halves of the prefix hash.
        self.config = ModelConfig(architecture="llama", vocab_size=vocab_size, hidden_size=2, intermediate_size=2,
                                  num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, head_dim=2,
                                  rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=max_positions,
                                  tie_word_embeddings=False, attention_bias=False)

    def __call__(self, input_ids: torch.Tensor, meta: AttentionMetadata, kv: list[LayerKV],
                 logits_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
        cache = kv[0].k  # [num_pages, block_size, 1, 2]: the hash halves of each slot's prefix
        block_size = kv[0].block_size
        ids = input_ids.tolist()
        slots = meta.slot_mapping.tolist()
        tables = meta.block_tables
        hashes: list[int] = []
        for s in range(meta.num_seqs):
            q0, q1 = meta.query_start[s], meta.query_start[s + 1]
            q, mask = q1 - q0, meta.masks[s]
            tree = mask.shape[1] if mask is not None else q  # the extent's last keys the mask covers
            history = meta.kv_lens[s] - tree

            def cached(pos: int) -> int:  # the prefix hash stored at extent position pos
                hi, lo = cache[int(tables[s, pos // block_size]), pos % block_size, 0].tolist()
                return (int(hi) << 24) | int(lo)

            base = cached(history - 1) if history > 0 else _SEED
            local: list[int] = []
            for j in range(q):
                own = tree - q + j  # this token's key among the tree's
                if mask is None:
                    parent = own - 1
                else:
                    ancestors = torch.nonzero(mask[j, :own]).flatten()
                    parent = int(ancestors[-1]) if len(ancestors) else -1
                if parent < 0:
                    prev = base
                elif parent < tree - q:  # a tree node fed by an earlier forward
                    prev = cached(history + parent)
                else:
                    prev = local[parent - (tree - q)]
                h = prefix_hash(prev, ids[q0 + j])
                local.append(h)
                slot = slots[q0 + j]
                if slot >= 0:
                    cache[slot // block_size, slot % block_size, 0, 0] = float(h >> 24)
                    cache[slot // block_size, slot % block_size, 0, 1] = float(h % _HALF)
            hashes.extend(local)
        rows = range(len(ids)) if logits_indices is None else logits_indices.tolist()
        logits = torch.zeros(len(rows), self.config.vocab_size)
        for r, i in enumerate(rows):
            logits[r, self.table.get(hashes[i], UNKNOWN)] = 1.0
        return logits
