"""KVCachePool.compact: one kv_compact over all of a step's sequences and all of a model's
layers. It moves each accepted tree path next to its history, as copy_slots would move each
path's slots one request at a time.
- On a two-model pool (target and draft, with different layer counts, KV shapes and block
  sizes), with lookahead reservations that cross page boundaries, it equals per-request
  copy_slots of the same slots, bit for bit.
- A path that does not start at 0 and strictly increase is refused by name.
- The engine moves a step's tree paths with one compact per model. With draft-model trees,
  each step calls it once per model, with several requests' paths in one call, and the greedy
  outputs equal plain decoding (tests/python/test_engine.py checks the trees' KV and outputs
  in depth).
- GPU (skips without one): the same moves on a CUDA pool equal the CPU pool's.
"""

import numpy as np
import pytest
import torch

import specd
from specd.engine.params import SamplingParams
from specd.errors import InvalidArgumentError
from specd.kv_cache import KVCachePool, KVModel
from specd.models.config import ModelConfig
from test_engine import prompts_of_mixed_lengths, self_draft


def config(layers: int, kv_heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=kv_heads * head_dim * 2,
                       intermediate_size=32, num_hidden_layers=layers, num_attention_heads=kv_heads * 2,
                       num_key_value_heads=kv_heads, head_dim=head_dim, rope_theta=10000.0, rms_norm_eps=1e-6,
                       max_position_embeddings=512, tie_word_embeddings=True, attention_bias=False)


def pool_with_trees(device: str, seed: int):
    """A target + draft pool with random K/V, and for each model a list of (sequence, tree
    start, path) whose trees sit in reserved slots past committed histories."""
    rng = np.random.default_rng(seed)
    pool = KVCachePool([KVModel("target", config(3, 2, 8), torch.float32),
                        KVModel("draft", config(2, 1, 8), torch.float32)], num_pages=64, target_block_size=4,
                       device=device)
    pool.storage.copy_(torch.from_numpy(rng.integers(0, 256, pool.storage.numel(), dtype=np.uint8)))
    moves = {0: [], 1: []}
    for seq in range(5):
        pool.blocks.add_sequence(seq)
        for model in (0, 1):
            history, tree = int(rng.integers(0, 11)), int(rng.integers(2, 10))
            pool.blocks.reserve(seq, history, model=model)
            pool.blocks.commit(seq, history, model=model)
            pool.blocks.reserve(seq, tree, model=model)  # the tree's nodes: positions history .. + tree
            if seq == 3:
                continue  # a sequence with nothing to move
            accepted = int(rng.integers(1, tree))
            path = np.concatenate([[0], np.sort(rng.choice(np.arange(1, tree), accepted, replace=False))])
            moves[model].append((seq, history, path.astype(np.int32)))
    return pool, moves


def moved_by_copy_slots(pool: KVCachePool, moves) -> torch.Tensor:
    for model, rows in moves.items():
        for seq, start, path in rows:
            slots = pool.blocks.slots(seq, start, start + int(path[-1]) + 1, model=model)
            src, dst = slots[path[1:]], slots[1:len(path)]
            pool.copy_slots(model, torch.from_numpy(src), torch.from_numpy(dst))
    return pool.storage.clone()


def moved_by_compact(pool: KVCachePool, moves) -> torch.Tensor:
    for model, rows in moves.items():
        pool.compact(model, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    return pool.storage.clone()


@pytest.mark.parametrize("seed", range(4))
def test_compact_equals_per_request_copy_slots(seed):
    pool_a, moves = pool_with_trees("cpu", seed)
    pool_b, _ = pool_with_trees("cpu", seed)
    before = pool_a.storage.clone()
    want = moved_by_copy_slots(pool_a, moves)
    got = moved_by_compact(pool_b, moves)
    assert not torch.equal(want, before)  # the paths moved something
    assert torch.equal(got, want)


def test_compact_refuses_a_bad_path():
    pool, moves = pool_with_trees("cpu", 0)
    seq, start, path = moves[0][0]
    for bad in (path[1:], np.array([0, 2, 2], dtype=np.int32), np.array([1, 2], dtype=np.int32)):
        with pytest.raises(InvalidArgumentError, match=f"sequence {seq}'s path"):
            pool.compact(0, [seq], [start], [bad])
    with pytest.raises(InvalidArgumentError, match="2 sequences, 1 tree starts"):
        pool.compact(0, [seq, seq], [start], [path])


def test_engine_moves_a_steps_tree_paths_in_one_call_per_model(tiny_qwen2_dir, tmp_path, monkeypatch):
    """Draft-model trees (width 2, k 3) for 8 prompts: every step makes one target and one
    draft compact call, several requests' paths move in one call, and greedy outputs equal
    plain decoding."""
    calls = []
    real = KVCachePool.compact

    def recorded(self, model, seqs, tree_start, paths):
        calls.append((model, len(seqs)))
        return real(self, model, seqs, tree_start, paths)

    monkeypatch.setattr(KVCachePool, "compact", recorded)
    plain = specd.LLM(tiny_qwen2_dir)
    prompts = prompts_of_mixed_lengths(plain.tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    spec = specd.SpeculationConfig(method="draft", num_speculative_tokens=3, draft_tree_width=2)
    llm = specd.LLM(tiny_qwen2_dir, self_draft(tiny_qwen2_dir, tmp_path / "draft"), spec)
    calls.clear()
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    for model in (0, 1):
        sizes = [n for m, n in calls if m == model]
        assert len(sizes) == llm.engine.steps  # one call per step (an empty one moves nothing)
        assert max(sizes) >= 2, model  # several requests' paths in one call


def test_gpu_compact_equals_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cpu, moves = pool_with_trees("cpu", 7)
    gpu, _ = pool_with_trees("cuda", 7)
    assert torch.equal(moved_by_compact(gpu, moves).cpu(), moved_by_compact(cpu, moves))
