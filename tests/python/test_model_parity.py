"""Our paged, tree-masked Llama-family forward against Hugging Face transformers' logits on
the same weights (tiny random models saved with save_pretrained, loaded by specd's loader):
a full prefill, incremental decoding through the paged cache, and a token tree in one pass.
Max abs difference <= 1e-4 in float32."""

import numpy as np
import pytest
import torch

import specd
from specd.kv_cache import KVCachePool, KVModel
from specd.models.llama import LlamaModel
from specd.models.loader import load_model
from specd.engine.model_runner import Segment, forward
from tiny_models import load_hf_model, make_tiny_model

TOL = 1e-4


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral", "mistral_window6"])
def pair(request, tmp_path_factory, tiny_tokenizer_dir):
    arch, _, window = request.param.partition("_window")
    overrides = {"sliding_window": int(window)} if window else {}
    directory = tmp_path_factory.mktemp(f"parity_{request.param}")
    make_tiny_model(directory, arch, tokenizer_dir=tiny_tokenizer_dir, lm_head_scale=1.0, seed=3, **overrides)
    hf = load_hf_model(directory)
    ours = LlamaModel.from_loaded(load_model(directory, torch.float32, tokenizer=False))
    return arch, hf, ours


def new_pool(model: LlamaModel, pages: int = 64, block: int = 4) -> KVCachePool:
    pool = KVCachePool([KVModel("target", model.config, model.dtype)], pages, block)
    pool.blocks.add_sequence(0)
    return pool


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def run(ours: LlamaModel, pool: KVCachePool, ids: list[int], positions: list[int], mask=None) -> torch.Tensor:
    """Feeds ids after the sequence's committed tokens; returns logits of every new token."""
    committed = pool.blocks.info(0).committed
    slots = pool.blocks.reserve(0, len(ids)).slots
    key_positions = torch.tensor(list(range(committed)) + positions) if mask is not None else None
    seg = Segment(0, torch.tensor(ids), torch.tensor(positions), slots, committed + len(ids), mask,
                  key_positions, logits_from=0)
    logits = forward(ours, pool, 0, [seg])
    pool.blocks.commit(0, len(ids))
    return logits


def test_prefill_matches_hf(pair):
    _, hf, ours = pair
    ids = list(np.random.default_rng(0).integers(0, ours.config.vocab_size, 37))
    ids = [int(t) for t in ids]
    got = run(ours, new_pool(ours), ids, list(range(len(ids))))
    assert (got - hf_logits(hf, ids)).abs().max() <= TOL


def test_incremental_decoding_through_pages_matches_hf(pair):
    _, hf, ours = pair
    ids = [int(t) for t in np.random.default_rng(1).integers(0, ours.config.vocab_size, 30)]
    want = hf_logits(hf, ids)
    pool = new_pool(ours)  # 4-token blocks: chunks cross block boundaries
    got = [run(ours, pool, ids[:9], list(range(9)))]
    for start, end in ((9, 10), (10, 17), (17, 18), (18, 30)):
        got.append(run(ours, pool, ids[start:end], list(range(start, end))))
    assert (torch.cat(got) - want).abs().max() <= TOL


def test_tree_forward_matches_hf_per_path(pair):
    """Each tree node's logits equal HF's last logits for prefix + the node's path."""
    _, hf, ours = pair
    vocab = ours.config.vocab_size
    rng = np.random.default_rng(2)
    prefix = [int(t) for t in rng.integers(0, vocab, 11)]
    tree = specd.TokenTree(prefix[-1])
    for parent in (0, 0, 1, 1, 2, 3, 3, 5):
        tree.add_node(parent, int(rng.integers(0, vocab)))
    pool = new_pool(ours)
    run(ours, pool, prefix[:-1], list(range(len(prefix) - 1)))
    bits = tree.ancestor_mask()[:, 0]
    mask = torch.tensor([[(int(b) >> j) & 1 == 1 for j in range(len(tree))] for b in bits])
    positions = (len(prefix) - 1 + tree.depths).tolist()
    got = run(ours, pool, tree.tokens.tolist(), positions, mask)
    for v in range(len(tree)):
        path, node = [], v
        while node > 0:
            path.append(int(tree.tokens[node]))
            node = int(tree.parents[node])
        want = hf_logits(hf, prefix + path[::-1])[-1]
        assert (got[v] - want).abs().max() <= TOL, f"node {v}"


def test_bfloat16_forward_is_close_to_float32(pair, tmp_path):
    _, hf, ours = pair
    ids = [int(t) for t in np.random.default_rng(4).integers(0, ours.config.vocab_size, 20)]
    want = hf_logits(hf, ids)
    bf16 = LlamaModel.from_loaded(load_model(pair_dir(hf), torch.bfloat16, tokenizer=False))
    got = run(bf16, new_pool(bf16), ids, list(range(len(ids))))
    assert got.dtype == torch.float32
    assert (got - want).abs().max() < 0.1 * want.abs().max() + 0.05


def pair_dir(hf):
    return hf.name_or_path
