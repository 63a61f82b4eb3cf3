"""The KV kernels' CPU references through the binding (specd._core), against the Python model's
own KV code: kv_write_cpu against models.attention.write_kv, tree_attention_cpu against
TorchPagedAttention (the default attention backend) on random trees, histories and GQA shapes,
kv_compact_cpu against an out-of-place gather, draft_step_inputs_cpu against slot_mapping; and
the binding's argument errors. The CUDA entry points (``*_cuda``) are compiled but only checked
for presence here: they need a GPU and device tensors."""

import numpy as np
import pytest
import torch

from specd import _core, errors
from specd.models.attention import AttentionMetadata, LayerKV, TorchPagedAttention, write_kv


def random_batch(rng, seqs=3, bs=4, kv_heads=2, group=2, dim=8, max_drafts=9, max_history=20):
    """Caches [P, bs, Hkv, D], shuffled block tables, trees after random histories."""
    trees, hist = [], []
    for _ in range(seqs):
        tree = _core.TokenTree(0)
        for i in range(1, int(rng.integers(0, max_drafts + 1)) + 1):
            tree.add_node(int(rng.integers(0, i)), i)
        trees.append(tree)
        hist.append(int(rng.integers(0, max_history + 1)))
    kv_lens = [h + len(t) for h, t in zip(hist, trees)]
    width = max(-(-n // bs) for n in kv_lens)
    pages = rng.permutation(seqs * width + 2).astype(np.int32)
    table = pages[: seqs * width].reshape(seqs, width)
    k_cache = torch.from_numpy(rng.standard_normal((len(pages), bs, kv_heads, dim)).astype(np.float32))
    v_cache = torch.from_numpy(rng.standard_normal((len(pages), bs, kv_heads, dim)).astype(np.float32))
    return trees, hist, kv_lens, table, k_cache, v_cache, kv_heads * group


def bool_mask(tree):
    words = tree.ancestor_mask()
    n = len(tree)
    return torch.tensor([[(int(words[i, j // 64]) >> (j % 64)) & 1 == 1 for j in range(n)] for i in range(n)])


@pytest.mark.parametrize("seed", range(6))
def test_tree_attention_and_kv_write_match_the_torch_backend(seed):
    rng = np.random.default_rng(seed)
    trees, hist, kv_lens, table, kc, vc, q_heads = random_batch(rng, group=1 + seed % 3)
    kv_heads, dim, bs = kc.shape[2], kc.shape[3], kc.shape[1]
    q_lens = [len(t) for t in trees]
    query_start = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    tokens = int(query_start[-1])
    slots = np.array([table[s, p // bs] * bs + p % bs
                      for s in range(len(trees)) for p in range(hist[s], kv_lens[s])], dtype=np.int64)
    q = torch.from_numpy(rng.standard_normal((tokens, q_heads, dim)).astype(np.float32))
    k = torch.from_numpy(rng.standard_normal((tokens, kv_heads, dim)).astype(np.float32))
    v = torch.from_numpy(rng.standard_normal((tokens, kv_heads, dim)).astype(np.float32))
    causal = seed % 2 == 1  # odd seeds: chains as plain causal attention (no mask)
    masks = [None if causal else bool_mask(t) for t in trees]

    # The C++ write first, on copies (numpy views share nothing with the torch caches below).
    kc_np, vc_np = kc.numpy().copy(), vc.numpy().copy()
    _core.kv_write_cpu(kc_np, vc_np, k.numpy(), v.numpy(), slots, strict=True)

    meta = AttentionMetadata(query_start=query_start.tolist(), kv_lens=kv_lens,
                             block_tables=torch.from_numpy(table.astype(np.int64)),
                             slot_mapping=torch.from_numpy(slots), positions=torch.zeros(tokens, dtype=torch.int64),
                             masks=masks)
    want = TorchPagedAttention().forward(q, k, v, LayerKV(kc, vc), meta, None)
    np.testing.assert_array_equal(kc_np, kc.numpy())  # same cache after both writes
    np.testing.assert_array_equal(vc_np, vc.numpy())

    tree_mask = None if causal else np.concatenate([t.ancestor_mask() for t in trees])  # 1 word each
    got = _core.tree_attention_cpu(q.numpy(), kc_np, vc_np, table, query_start,
                                   np.array(kv_lens, dtype=np.int32), tree_mask, strict=True)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed,window", [(0, None), (1, None), (2, 3), (3, 5)])
def test_a_tree_fed_in_two_forwards_attends_as_one(seed, window):
    """A tree's nodes fed in two forwards, the second masked over every node fed so far
    (AttentionMetadata.masks of shape [q, t]; tree_attention's tree_lens), attend exactly as
    the whole tree fed at once: through TorchPagedAttention (also with a sliding window on
    the nodes' logical positions, history then root position + depth), and through the
    kernel's CPU reference with tree_lens (no window)."""
    rng = np.random.default_rng(100 + seed)
    trees, hist, kv_lens, table, kc, vc, q_heads = random_batch(rng, group=1 + seed % 2, max_drafts=12)
    kv_heads, dim, bs = kc.shape[2], kc.shape[3], kc.shape[1]
    sizes = [len(t) for t in trees]
    cuts = [int(rng.integers(0, n)) for n in sizes]  # the first forward feeds nodes [0, cut)
    masks = [bool_mask(t) for t in trees]
    total = sum(sizes)
    q = torch.from_numpy(rng.standard_normal((total, q_heads, dim)).astype(np.float32))
    k = torch.from_numpy(rng.standard_normal((total, kv_heads, dim)).astype(np.float32))
    v = torch.from_numpy(rng.standard_normal((total, kv_heads, dim)).astype(np.float32))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    slot = lambda s, p: int(table[s, p // bs]) * bs + p % bs  # noqa: E731
    table64 = torch.from_numpy(table.astype(np.int64))

    def run(part):
        """Rows [lo, hi) of each tree: (output, the rows' global indices, query_start, kv_lens, masks)."""
        rows, q_start, lens, part_masks, slots, positions, keys = [], [0], [], [], [], [], []
        for s, (n, cut) in enumerate(zip(sizes, cuts)):
            lo, hi = part(n, cut)
            rows.extend(range(starts[s] + lo, starts[s] + hi))
            slots.extend(slot(s, hist[s] + m) for m in range(lo, hi))
            q_start.append(q_start[-1] + hi - lo)
            lens.append(hist[s] + hi)
            part_masks.append(masks[s][lo:hi, :hi])
            logical = hist[s] + trees[s].depths  # [n] the nodes' positions
            positions.extend(logical[lo:hi].tolist())
            keys.append(torch.tensor(list(range(hist[s])) + logical[:hi].tolist(), dtype=torch.int64))
        idx = torch.tensor(rows, dtype=torch.int64)
        meta = AttentionMetadata(query_start=q_start, kv_lens=lens, block_tables=table64,
                                 slot_mapping=torch.tensor(slots, dtype=torch.int64),
                                 positions=torch.tensor(positions, dtype=torch.int64), masks=part_masks,
                                 key_positions=keys if window else None)
        out = TorchPagedAttention().forward(q[idx], k[idx], v[idx], cache, meta, window)
        return out, idx, q_start, lens, part_masks

    cache = LayerKV(kc.clone(), vc.clone())
    whole, _, _, _, _ = run(lambda n, cut: (0, n))
    cache = LayerKV(kc.clone(), vc.clone())
    first, first_rows, _, _, _ = run(lambda n, cut: (0, cut))
    second, second_rows, q_start, lens, part_masks = run(lambda n, cut: (cut, n))
    got = torch.empty_like(whole)
    got[first_rows], got[second_rows] = first, second
    torch.testing.assert_close(got, whole, rtol=1e-5, atol=1e-5)
    if window is not None:
        return

    # The kernel's reference: the second forward's rows, tree_lens = every node fed so far.
    bits = np.zeros((len(second_rows), 64), dtype=bool)
    row = 0
    for m in part_masks:
        bits[row:row + m.shape[0], :m.shape[1]] = m.numpy()
        row += m.shape[0]
    tree_mask = np.packbits(bits, axis=1, bitorder="little").view("<i8")
    ref = _core.tree_attention_cpu(q[second_rows].numpy(), cache.k.numpy(), cache.v.numpy(), table,
                                   np.array(q_start, dtype=np.int32), np.array(lens, dtype=np.int32), tree_mask,
                                   tree_lens=np.array(sizes, dtype=np.int32), strict=True)
    np.testing.assert_allclose(ref, second.numpy(), rtol=1e-5, atol=1e-5)


def test_a_mask_of_the_wrong_shape_is_refused():
    cache = LayerKV(torch.zeros(4, 4, 1, 8), torch.zeros(4, 4, 1, 8))
    x = torch.zeros(2, 1, 8)
    for mask in (torch.ones(2, 1, dtype=torch.bool), torch.ones(3, 3, dtype=torch.bool),
                 torch.ones(2, 6, dtype=torch.bool)):
        meta = AttentionMetadata(query_start=[0, 2], kv_lens=[5], block_tables=torch.tensor([[0, 1]]),
                                 slot_mapping=torch.tensor([3, 4]), positions=torch.tensor([3, 4]), masks=[mask])
        with pytest.raises(errors.InvalidArgumentError, match="mask of shape"):
            TorchPagedAttention().forward(x, x, x, cache, meta, None)


def test_kv_compact_matches_an_out_of_place_gather():
    rng = np.random.default_rng(7)
    layers, pages, bs, heads, dim = 3, 12, 4, 2, 5
    k = rng.standard_normal((layers, pages, bs, heads, dim)).astype(np.float32)
    v = rng.standard_normal((layers, pages, bs, heads, dim)).astype(np.float32)
    table = rng.permutation(pages)[:8].reshape(2, 4).astype(np.int32)
    tree_start = np.array([3, 0], dtype=np.int32)
    path = np.array([[0, 2, 5, 6, -1], [0, 1, 3, -1, -1]], dtype=np.int32)
    num_accepted = np.array([3, 2], dtype=np.int32)
    want_k, want_v = k.copy(), v.copy()
    for s in range(2):
        for d in range(1, num_accepted[s] + 1):
            src, dst = tree_start[s] + path[s, d], tree_start[s] + d
            for want, orig in ((want_k, k), (want_v, v)):
                want[:, table[s, dst // bs], dst % bs] = orig[:, table[s, src // bs], src % bs]
    _core.kv_compact_cpu(k, v, table, tree_start, path, num_accepted, strict=True)
    np.testing.assert_array_equal(k, want_k)
    np.testing.assert_array_equal(v, want_v)


def test_draft_step_inputs_match_slot_mapping():
    rng = np.random.default_rng(3)
    table = rng.permutation(40).reshape(5, 8).astype(np.int32)
    positions = rng.integers(0, 30, size=5).astype(np.int64)
    sampled = rng.integers(0, 1000, size=5).astype(np.int64)
    pos, ids, slots, lens = _core.draft_step_inputs_cpu(table, positions, sampled, block_size=4,
                                                        num_pages=40, step=1, strict=True)
    np.testing.assert_array_equal(pos, positions + 1)
    np.testing.assert_array_equal(ids, sampled)
    want = _core.slot_mapping_cpu(table, np.arange(5, dtype=np.int32), (positions + 1).astype(np.int32), 4)
    np.testing.assert_array_equal(slots, want)
    np.testing.assert_array_equal(lens, positions + 2)
    num_steps = np.array([1, 2, 3, 0, 5], dtype=np.int32)  # step 1 is active where num_steps > 1
    pos, _, slots, _ = _core.draft_step_inputs_cpu(table, positions, sampled, 4, 40, 1, num_steps)
    active = num_steps > 1
    np.testing.assert_array_equal(pos, positions + active)
    np.testing.assert_array_equal(slots[~active], -1)


def test_argument_errors():
    cache = np.zeros((2, 4, 1, 8), dtype=np.float32)
    k = np.zeros((1, 1, 8), dtype=np.float32)
    with pytest.raises(errors.InvalidArgumentError, match="float32"):
        _core.kv_write_cpu(cache.astype(np.float64), cache, k, k, np.zeros(1, dtype=np.int64))
    with pytest.raises(errors.InvalidArgumentError, match="C-contiguous"):
        _core.kv_write_cpu(cache[:, ::2], cache[:, ::2], k, k, np.zeros(1, dtype=np.int64))
    with pytest.raises(errors.InvalidArgumentError, match="shape"):
        _core.kv_write_cpu(cache, cache.copy(), np.zeros((2, 1, 8), dtype=np.float32), k,
                           np.zeros(1, dtype=np.int64))
    with pytest.raises(errors.OutOfRangeError):
        _core.kv_write_cpu(cache, cache.copy(), k, k, np.array([8], dtype=np.int64), strict=True)
    q = np.zeros((1, 3, 8), dtype=np.float32)  # 3 query heads over 1 kv head: fine; 3 over 2: not
    with pytest.raises(errors.InvalidArgumentError, match="multiple"):
        _core.tree_attention_cpu(q, np.zeros((2, 4, 2, 8), np.float32), np.zeros((2, 4, 2, 8), np.float32),
                                 np.zeros((1, 2), np.int32), np.array([0, 1], np.int32), np.array([1], np.int32))
    with pytest.raises(errors.InvalidArgumentError):
        _core.PagedKvLayout(num_pages=1, block_size=4, kv_heads=2, head_dim=8, page_stride=63)
    layout = _core.PagedKvLayout(num_pages=1, block_size=4, kv_heads=2, head_dim=8, page_stride=64)
    assert (layout.block_size, layout.page_stride) == (4, 64)


def test_cuda_entry_points_exist_when_built_with_cuda():
    names = ["kv_write_cuda", "kv_compact_cuda", "draft_step_inputs_cuda", "tree_attention_cuda",
             "tree_attention_grouped_plan"]
    for name in names:
        assert hasattr(_core, name) == bool(_core.built_with_cuda), name
