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


@pytest.mark.parametrize("products", [None, "torch", "onednn"])
def test_prefill_matches_hf(pair, products):
    """With either CPU product (models/cpu_linear.py; None: the default, oneDNN where it runs)."""
    _, hf, ours = pair
    ids = list(np.random.default_rng(0).integers(0, ours.config.vocab_size, 37))
    ids = [int(t) for t in ids]
    ours.cpu_linear = products
    try:
        got = run(ours, new_pool(ours), ids, list(range(len(ids))))
    finally:
        ours.cpu_linear = None
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


def test_kernel_attention_forward_matches_hf(pair):
    """forward(kernel=True), the path the engine takes for causal batches on CUDA (here the
    kernel's CPU reference): two sequences with different histories in each varlen forward,
    chunks crossing 4-token pages, give HF's logits; a sliding-window model is refused."""
    _, hf, ours = pair
    rng = np.random.default_rng(2)
    ids = [[int(t) for t in rng.integers(0, ours.config.vocab_size, n)] for n in (14, 11)]
    pool = KVCachePool([KVModel("target", ours.config, ours.dtype)], 64, 4)
    for seq in (0, 1):
        pool.blocks.add_sequence(seq)

    def step(chunks):  # chunks: (seq, start, end) -> logits of every new token, per chunk
        segs = []
        for seq, start, end in chunks:
            slots = pool.blocks.reserve(seq, end - start).slots
            segs.append(Segment(seq, torch.tensor(ids[seq][start:end]), torch.arange(start, end), slots, end, None,
                                logits_from=0))
        logits = forward(ours, pool, 0, segs, kernel=True)
        for seq, start, end in chunks:
            pool.blocks.commit(seq, end - start)
        return logits.split([end - start for _, start, end in chunks])

    if ours.window is not None:
        with pytest.raises(specd.InvalidArgumentError, match="sliding window"):
            step([(0, 0, 3)])
        return
    got = {0: [], 1: []}
    for chunks in ([(0, 0, 9), (1, 0, 5)], [(0, 9, 10), (1, 5, 8)], [(1, 8, 11), (0, 10, 14)]):
        for (seq, _, _), logits in zip(chunks, step(chunks)):
            got[seq].append(logits)
    for seq in (0, 1):
        assert (torch.cat(got[seq]) - hf_logits(hf, ids[seq])).abs().max() <= TOL


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


def test_kernel_attention_takes_tree_masks(pair):
    """forward(kernel=True) on a batch mixing a prefill chunk followed by a token tree (the
    fused first verify), a plain causal chunk, and a draft-tree-like segment of 70 nodes (two
    mask words) gives the torch path's logits: the tree masks travel as tree_mask rows
    (tree_mask_rows) and causal segments get causal rows."""
    _, _, ours = pair
    if ours.window is not None:
        pytest.skip("the kernel has no sliding window (refused, test_kernel_attention_forward_matches_hf)")
    vocab = ours.config.vocab_size
    rng = np.random.default_rng(7)
    pool = KVCachePool([KVModel("target", ours.config, ours.dtype)], 128, 4)
    segs = []
    # seq 0: 6 history tokens committed, then 5 prefix tokens + a branchy tree of 7 nodes.
    tree = specd.TokenTree(int(rng.integers(vocab)))
    for parent in (0, 0, 1, 2, 2, 4):
        tree.add_node(parent, int(rng.integers(vocab)))
    # seq 2: 70 nodes, each seeing itself and a random earlier node's ancestors.
    parents = [-1] + [int(rng.integers(0, v)) for v in range(1, 70)]
    big = torch.zeros(70, 70, dtype=torch.bool)
    for v in range(70):
        node = v
        while node >= 0:
            big[v, node] = True
            node = parents[node]
    for seq in range(3):
        pool.blocks.add_sequence(seq)
    history = {0: 6, 1: 9, 2: 12}
    for seq, n in history.items():  # commit some history first
        slots = pool.blocks.reserve(seq, n).slots
        forward(ours, pool, 0, [Segment(seq, torch.tensor(rng.integers(0, vocab, n)), torch.arange(n), slots, n,
                                        None)])
        pool.blocks.commit(seq, n)
    n0 = 5 + len(tree)
    mask0 = torch.ones(n0, n0, dtype=torch.bool).tril()
    bits = tree.ancestor_mask()[:, 0]
    mask0[5:, 5:] = torch.tensor([[(int(b) >> j) & 1 == 1 for j in range(len(tree))] for b in bits])
    ids0 = torch.tensor(list(rng.integers(0, vocab, 5)) + tree.tokens.tolist())
    pos0 = torch.tensor(list(range(6, 11)) + (10 + tree.depths).tolist())
    depth = [0] * 70
    for v in range(1, 70):
        depth[v] = depth[parents[v]] + 1
    for seq, ids, pos, mask in ((0, ids0, pos0, mask0),
                                (1, torch.tensor(rng.integers(0, vocab, 4)), torch.arange(9, 13), None),
                                (2, torch.tensor(rng.integers(0, vocab, 70)), 12 + torch.tensor(depth), big)):
        slots = pool.blocks.reserve(seq, len(ids)).slots
        segs.append(Segment(seq, ids, pos, slots, history[seq] + len(ids), mask, logits_from=0))
    want = forward(ours, pool, 0, segs, kernel=False)
    got = forward(ours, pool, 0, segs, kernel=True)
    assert got.shape == want.shape == (n0 + 4 + 70, vocab)
    assert (got - want).abs().max() <= TOL


def test_tree_mask_rows_pack_bits_as_the_kernel_reads_them():
    """tree_mask_rows: bit m % 64 of word m // 64 of row t is whether token t sees its segment's
    new token m; causal rows (130 tokens: three words) and a random mask (70 tokens) in one
    batch; all-causal batches need no mask."""
    from specd.engine.model_runner import tree_mask_rows

    rng = np.random.default_rng(8)
    mask = torch.from_numpy(rng.random((70, 70)) < 0.3)

    def seg(q, m):
        return Segment(0, torch.zeros(q, dtype=torch.int64), torch.arange(q), np.full(q, -1), q, m)

    rows = tree_mask_rows([seg(130, None), seg(70, mask), seg(3, None)])
    assert rows.dtype == np.int64 and rows.shape == (203, 3)
    want = np.zeros((203, 192), dtype=bool)
    want[:130, :130] = np.tri(130, dtype=bool)
    want[130:200, :70] = mask.numpy()
    want[200:, :3] = np.tri(3, dtype=bool)
    got = (rows.view(np.uint64)[:, :, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    assert np.array_equal(got.reshape(203, 192).astype(bool), want)
    assert tree_mask_rows([seg(5, None), seg(2, None)]) is None


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
