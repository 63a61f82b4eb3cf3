"""The torch custom ops of specd.ops (torch.ops.specd.*): on CPU each op equals the direct
specd._core reference on random inputs (exactly for integer outputs and copies), caches are
written in place (strided pool views, 16-bit dtypes), bad arguments raise InvalidArgumentError,
and torch.library.opcheck accepts every op's registration (schema, fake, aot dispatch).
GPU tests (the op on cuda equals the op on cpu) skip without a CUDA device."""

import inspect
import numpy as np
import pytest
import torch

import specd.ops as ops
from specd import _core, errors
from specd.models.attention import LayerKV, write_kv
from specd.ops._checks import common_device

# ---- random inputs ----


def paged_caches(rng, pages=10, bs=4, heads=2, dim=8, dtype=torch.float32, layers=None, strided=False):
    """K, V caches [(layers,) pages, bs, heads, dim]; strided: one layer's views of a pool page
    holding 3 layers' K and V (page_stride > page size), like KVCachePool."""
    if strided:
        pool = torch.from_numpy(rng.standard_normal((pages, 3, 2, bs, heads, dim)).astype(np.float32)).to(dtype)
        return pool[:, 1, 0], pool[:, 1, 1]
    shape = ((layers,) if layers else ()) + (pages, bs, heads, dim)
    return tuple(torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(dtype) for _ in range(2))


def random_tables(rng, seqs, width, pages):
    return torch.from_numpy(rng.permutation(pages)[: seqs * width].reshape(seqs, width).astype(np.int32))


def random_trees(rng, batch, vocab, max_nodes=7):
    trees = []
    for _ in range(batch):
        tree = _core.TokenTree(int(rng.integers(vocab)))
        for v in range(1, int(rng.integers(1, max_nodes + 1))):
            parent = int(rng.integers(0, v))
            used = {int(tree.tokens[c]) for c in range(len(tree)) if int(tree.parents[c]) == parent}
            tree.add_node(parent, int(rng.choice([t for t in range(vocab) if t not in used])))
        trees.append(tree)
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in trees])]).astype(np.int32)
    flat = [torch.from_numpy(np.concatenate([getattr(t, f) for t in trees]).astype(np.int32))
            for f in ("parents", "tokens")]
    return trees, torch.from_numpy(offsets), flat[0], flat[1]


def param_rows(rows):
    """(temperature, top_k, top_p, min_p) per row -> packed int64 [rows, 4]."""
    cols = list(zip(*rows))
    return ops.pack_sampling_params(torch.tensor(cols[0], dtype=torch.float64), torch.tensor(cols[1]),
                                    torch.tensor(cols[2], dtype=torch.float64), torch.tensor(cols[3], dtype=torch.float64))


PARAMS = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 5, 1.0, 0.0), (1.3, 0, 0.8, 0.0), (0.9, 8, 0.9, 0.05),
          (1.0, 0, 1.0, 0.1)]


def kv_case(rng, dtype=torch.float32, strided=False):
    kc, vc = paged_caches(rng, dtype=dtype, strided=strided)
    tokens = 7
    slots = torch.from_numpy(rng.permutation(kc.shape[0] * kc.shape[1])[:tokens].astype(np.int64))
    slots[2] = -1
    k, v = (torch.from_numpy(rng.standard_normal((tokens, 2, 8)).astype(np.float32)).to(dtype) for _ in range(2))
    return kc, vc, k, v, slots


def attention_case(rng, seqs=3, causal=False):
    pages = max(16, seqs * 5)  # every sequence owns 5 distinct pages (16 for the CPU cases' draws)
    kc, vc = paged_caches(rng, pages=pages)
    trees, _, _, _ = random_trees(rng, seqs, 50, max_nodes=6)
    hist = rng.integers(0, 12, size=seqs)
    kv_lens = torch.tensor([h + len(t) for h, t in zip(hist, trees)], dtype=torch.int32)
    table = random_tables(rng, seqs, 5, pages)
    starts = torch.tensor(np.concatenate([[0], np.cumsum([len(t) for t in trees])]), dtype=torch.int32)
    q = torch.from_numpy(rng.standard_normal((int(starts[-1]), 4, 8)).astype(np.float32))
    mask = None if causal else torch.from_numpy(np.concatenate([t.ancestor_mask() for t in trees]).view(np.int64))
    return q, kc, vc, table, starts, kv_lens, mask


# ---- CPU: each op equals the reference ----


@pytest.mark.parametrize("seed", range(3))
def test_kv_write_equals_reference(seed):
    rng = np.random.default_rng(seed)
    kc, vc, k, v, slots = kv_case(rng)
    want_k, want_v = kc.numpy().copy(), vc.numpy().copy()
    _core.kv_write_cpu(want_k, want_v, k.numpy(), v.numpy(), slots.numpy())
    ops.kv_write(kc, vc, k, v, slots)
    np.testing.assert_array_equal(kc.numpy(), want_k)
    np.testing.assert_array_equal(vc.numpy(), want_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kv_write_in_place_on_strided_pool_views(dtype):
    rng = np.random.default_rng(1)
    kc, vc, k, v, slots = kv_case(rng, dtype, strided=True)
    base = kc._base
    want = LayerKV(kc.clone(), vc.clone())
    keep = slots >= 0
    write_kv(want, k[keep], v[keep], slots[keep])
    ops.kv_write(kc, vc, k[:, :, :], v, slots)
    assert kc._base is base  # still the pool's views
    assert torch.equal(kc, want.k) and torch.equal(vc, want.v)


def test_kv_write_with_token_strided_rows():
    rng = np.random.default_rng(2)
    kc, vc, k, v, slots = kv_case(rng)
    wide = torch.zeros(7, 3, 2, 8)
    wide[:, 1] = k
    want_k, want_v = kc.clone(), vc.clone()
    ops.kv_write(want_k, want_v, k, v, slots)
    ops.kv_write(kc, vc, wide[:, 1], v, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


def test_kv_compact_equals_reference_and_stacked_pool_layers():
    rng = np.random.default_rng(3)
    kc, vc = paged_caches(rng, pages=12, layers=3)
    table = random_tables(rng, 2, 4, 12)
    tree_start = torch.tensor([3, 0], dtype=torch.int32)
    path = torch.tensor([[0, 2, 5, 9, -1], [0, 1, 3, -1, -1]], dtype=torch.int32)
    accepted = torch.tensor([3, 2], dtype=torch.int32)
    want_k, want_v = kc.numpy().copy(), vc.numpy().copy()
    _core.kv_compact_cpu(want_k, want_v, table.numpy(), tree_start.numpy(), path.numpy(), accepted.numpy(),
                         strict=True)
    ops.kv_compact(kc, vc, table, tree_start, path, accepted)
    np.testing.assert_array_equal(kc.numpy(), want_k)
    np.testing.assert_array_equal(vc.numpy(), want_v)

    # The same moves on a pool-like storage, all layers in one call through stacked_kv.
    pool = torch.from_numpy(rng.standard_normal((12, 3, 2, 4, 2, 8)).astype(np.float32))
    layers = [LayerKV(pool[:, i, 0], pool[:, i, 1]) for i in range(3)]
    want = pool.clone()
    for i in range(3):
        k_np, v_np = want[:, i, 0].contiguous().numpy(), want[:, i, 1].contiguous().numpy()
        _core.kv_compact_cpu(k_np, v_np, table.numpy(), tree_start.numpy(), path.numpy(), accepted.numpy())
        want[:, i, 0], want[:, i, 1] = torch.from_numpy(k_np), torch.from_numpy(v_np)
    k5, v5 = ops.stacked_kv(layers)
    assert k5.shape == (3, 12, 4, 2, 8) and k5.data_ptr() == pool.data_ptr()
    ops.kv_compact(k5, v5, table, tree_start, path, accepted)
    assert torch.equal(pool, want)


def test_slot_mapping_equals_reference():
    rng = np.random.default_rng(4)
    table = random_tables(rng, 3, 4, 20)
    seq_index = torch.tensor([0, 0, 1, -1, 2, 2, 1], dtype=torch.int32)
    positions = torch.tensor([0, 5, 3, 0, 15, 16, 9], dtype=torch.int32)
    got = ops.slot_mapping(table, seq_index, positions, 4)
    want = _core.slot_mapping_cpu(table.numpy(), seq_index.numpy(), positions.numpy(), 4)
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("with_steps", [False, True])
def test_draft_step_inputs_equals_reference_and_in_place_form(with_steps):
    rng = np.random.default_rng(5)
    table = random_tables(rng, 4, 3, 16)
    positions = torch.tensor([0, 4, 7, 11], dtype=torch.int64)
    sampled = torch.tensor([5, 6, 7, 8], dtype=torch.int64)
    steps = torch.tensor([3, 1, 2, 5], dtype=torch.int32) if with_steps else None
    got = ops.draft_step_inputs(table, positions, sampled, 4, 16, 2, steps)
    want = _core.draft_step_inputs_cpu(table.numpy(), positions.numpy(), sampled.numpy(), 4, 16, 2,
                                       None if steps is None else steps.numpy())
    for g, w in zip(got, want):
        assert g.dtype == torch.from_numpy(w).dtype
        np.testing.assert_array_equal(g.numpy(), w)
    buffers = [positions.clone(), torch.empty(4, dtype=torch.int64), torch.empty(4, dtype=torch.int64),
               torch.empty(4, dtype=torch.int32)]
    ops.draft_step_inputs_inplace(table, buffers[0], sampled, *buffers[1:], 4, 16, 2, steps)
    for g, w in zip(buffers, got):
        assert torch.equal(g, w)


@pytest.mark.parametrize("causal", [False, True])
def test_tree_attention_equals_reference(causal):
    rng = np.random.default_rng(6 + causal)
    q, kc, vc, table, starts, kv_lens, mask = attention_case(rng, causal=causal)
    got = ops.tree_attention(q, kc, vc, table, starts, kv_lens, mask)
    want = _core.tree_attention_cpu(q.numpy(), kc.numpy(), vc.numpy(), table.numpy(), starts.numpy(),
                                    kv_lens.numpy(), None if mask is None else mask.numpy().view(np.uint64))
    np.testing.assert_array_equal(got.numpy(), want)
    wide = torch.zeros(q.shape[0], 2, 4, 8)  # token-strided q gives the same result
    wide[:, 0] = q
    assert torch.equal(ops.tree_attention(wide[:, 0], kc, vc, table, starts, kv_lens, mask, 0.3),
                       torch.from_numpy(_core.tree_attention_cpu(q.numpy(), kc.numpy(), vc.numpy(), table.numpy(),
                                                                 starts.numpy(), kv_lens.numpy(),
                                                                 None if mask is None else mask.numpy().view(np.uint64),
                                                                 0.3)))


def newest_only(case, rng):
    """A tree-attention case with only the newest nodes of each request as queries (a random
    number, 0 included), ``tree_lens`` its trees' sizes; and the rows of the full case they are."""
    q, kc, vc, table, starts, kv_lens, mask = case
    rows, part_starts, sizes = [], [0], []
    for r in range(len(starts) - 1):
        a, b = int(starts[r]), int(starts[r + 1])
        keep = int(rng.integers(0, b - a + 1))
        rows.extend(range(b - keep, b))
        part_starts.append(part_starts[-1] + keep)
        sizes.append(b - a)
    index = torch.tensor(rows, dtype=torch.int64)
    part = (q[index], kc, vc, table, torch.tensor(part_starts, dtype=torch.int32), kv_lens,
            None if mask is None else mask[index])
    return part, torch.tensor(sizes, dtype=torch.int32), index


@pytest.mark.parametrize("causal", [False, True])
def test_tree_attention_tree_lens_feed_only_the_newest_nodes(causal):
    """tree_lens: a forward that feeds only each tree's newest nodes gets, for them, exactly
    what a forward feeding whole trees gets (the CPU reference); it equals the _core binding."""
    rng = np.random.default_rng(16 + causal)
    case = attention_case(rng, seqs=4, causal=causal)
    full = ops.tree_attention(*case)
    part, tree_lens, rows = newest_only(case, rng)
    got = ops.tree_attention(*part, tree_lens=tree_lens)
    assert 0 < len(rows) < full.shape[0]
    assert torch.equal(got, full[rows])
    q, kc, vc, table, starts, kv_lens, mask = part
    direct = _core.tree_attention_cpu(q.numpy(), kc.numpy(), vc.numpy(), table.numpy(), starts.numpy(),
                                      kv_lens.numpy(), None if mask is None else mask.numpy().view(np.uint64),
                                      tree_lens=tree_lens.numpy())
    np.testing.assert_array_equal(got.numpy(), direct)
    with pytest.raises(errors.InvalidArgumentError, match="tree_lens"):
        ops.tree_attention(*part, tree_lens=tree_lens[:-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sample_tokens_and_sampling_probs_equal_references(dtype):
    rng = np.random.default_rng(8)
    logits = torch.from_numpy(rng.standard_normal((len(PARAMS), 40)).astype(np.float32) * 3).to(dtype)
    logits[1, 3] = float("-inf")
    params = param_rows(PARAMS)
    keys = ops.pack_rng_keys(torch.tensor(7), torch.arange(len(PARAMS)),
                             torch.tensor(1), torch.arange(len(PARAMS)) + 100)
    tokens, status = ops.sample_tokens(logits, params, keys)
    probs, pstatus = ops.sampling_probs(logits, params)
    assert tokens.dtype == torch.int32 and not status.any() and not pstatus.any()
    rows = logits.float().numpy()
    for r, (t, k, p, m) in enumerate(PARAMS):
        ref = _core.sampling_probs(rows[r:r + 1], t, k, p, m)[0]
        np.testing.assert_array_equal(probs[r].numpy(), ref)
        assert int(tokens[r]) == _core.sample_token(ref, 7, r, 1, r + 100)
    both_tokens, both_probs, both_status = ops.sample_tokens_and_probs(logits, params, keys)
    assert torch.equal(both_tokens, tokens) and torch.equal(both_probs, probs) and torch.equal(both_status, status)
    # The _out form writes the same rows into a buffer (a block of a larger one, as the draft
    # graph's), overwriting whatever was there.
    buf = torch.full((3, len(PARAMS), 40), float("nan"))
    out_tokens, out_status = ops.sample_tokens_and_probs_out(logits, params, keys, buf[1])
    assert torch.equal(out_tokens, tokens) and torch.equal(out_status, status) and torch.equal(buf[1], probs)
    assert buf[0].isnan().all() and buf[2].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_tokens_gumbel_draw(dtype):
    """gumbel=True (DrawRule::kGumbelMax): the same statuses and greedy tokens as the default
    draw, only tokens the rules keep, other tokens than the inverse-CDF draw for some seeds
    (another rule, the same distribution: tests/python/test_gpu_statistics.py), and the same
    tokens on every call with the same keys."""
    rng = np.random.default_rng(12)
    n = 400
    rows = [PARAMS[i % len(PARAMS)] for i in range(n)]
    logits = torch.from_numpy(rng.standard_normal((n, 50)).astype(np.float32) * 2).to(dtype)
    logits[3, :] = float("nan")
    logits[5, 7] = float("-inf")
    params = param_rows(rows)
    keys = ops.pack_rng_keys(torch.tensor(3), torch.arange(n), torch.tensor(0), torch.tensor(40))
    tokens, status = ops.sample_tokens(logits, params, keys, gumbel=True)
    plain, plain_status = ops.sample_tokens(logits, params, keys)
    probs, _ = ops.sampling_probs(logits, params)
    assert torch.equal(status, plain_status) and status[3] == 2 and tokens[3] == -1
    ok = status == 0
    greedy = torch.tensor([r[0] == 0 for r in rows]) & ok
    assert torch.equal(tokens[greedy], plain[greedy])
    kept = probs[ok].gather(1, tokens[ok].long()[:, None])[:, 0]
    assert (kept > 0).all()
    assert (tokens[ok & ~greedy] != plain[ok & ~greedy]).any()
    assert torch.equal(ops.sample_tokens(logits, params, keys, gumbel=True)[0], tokens)


def test_sample_tokens_and_probs_gumbel_draw():
    """gumbel=True on the probability-row ops: the same rows and statuses, tokens from the
    written rows (probability > 0), other tokens than the inverse-CDF draw for some seeds,
    greedy rows unchanged; the _out form writes the same."""
    rng = np.random.default_rng(13)
    n = 300
    rows = [PARAMS[i % len(PARAMS)] for i in range(n)]
    logits = torch.from_numpy(rng.standard_normal((n, 40)).astype(np.float32) * 2)
    logits[4, :] = float("nan")
    params = param_rows(rows)
    keys = ops.pack_rng_keys(torch.tensor(9), torch.arange(n), torch.tensor(1), torch.tensor(70))
    tokens, probs, status = ops.sample_tokens_and_probs(logits, params, keys, gumbel=True)
    plain, plain_probs, plain_status = ops.sample_tokens_and_probs(logits, params, keys)
    assert torch.equal(probs, plain_probs) and torch.equal(status, plain_status) and status[4] == 2
    ok = status == 0
    greedy = torch.tensor([r[0] == 0 for r in rows]) & ok
    assert torch.equal(tokens[greedy], plain[greedy]) and tokens[4] == -1
    assert (probs[ok].gather(1, tokens[ok].long()[:, None]) > 0).all()
    assert (tokens[ok & ~greedy] != plain[ok & ~greedy]).any()
    buf = torch.full((n, 40), float("nan"))
    out_tokens, out_status = ops.sample_tokens_and_probs_out(logits, params, keys, buf, gumbel=True)
    assert torch.equal(out_tokens, tokens) and torch.equal(out_status, status) and torch.equal(buf, probs)


def test_sample_tokens_and_probs_out_errors():
    logits, params = torch.zeros(2, 5), param_rows(PARAMS[:2])
    keys = ops.pack_rng_keys(torch.tensor(1), torch.arange(2), torch.tensor(0), torch.tensor(4))
    op = ops.sample_tokens_and_probs_out
    with pytest.raises(errors.InvalidArgumentError, match="probs must be torch.float32"):
        op(logits, params, keys, torch.zeros(2, 5, dtype=torch.float64))
    with pytest.raises(errors.InvalidArgumentError, match="probs must have shape"):
        op(logits, params, keys, torch.zeros(2, 6))
    with pytest.raises(errors.InvalidArgumentError, match="probs must be contiguous"):
        op(logits, params, keys, torch.zeros(5, 2).t())


def test_sampling_statuses_and_64_bit_seeds():
    logits = torch.tensor([[0.0, 1.0, 2.0], [0.0, float("nan"), 1.0], [0.5, 0.1, 0.2]])
    params = param_rows([(-1.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0)])
    keys = ops.pack_rng_keys(torch.tensor(-2), torch.tensor(3), torch.tensor(0), torch.tensor(9)).expand(3, 3)
    tokens, status = ops.sample_tokens(logits, params, keys)
    assert status.tolist()[:2] == [1, 2] and tokens.tolist()[:2] == [-1, -1] and status[2] == 0
    ref = _core.sampling_probs(logits[2:].numpy(), 1.0, 0, 1.0, 0.0)[0]
    assert int(tokens[2]) == _core.sample_token(ref, 2**64 - 2, 3, 0, 9)  # seed -2 = its 64 bits
    both_tokens, both_probs, both_status = ops.sample_tokens_and_probs(logits, params, keys.contiguous())
    assert torch.equal(both_tokens, tokens) and torch.equal(both_status, status)
    assert not both_probs[:2].any() and torch.equal(both_probs[2], torch.from_numpy(ref))


@pytest.mark.parametrize("out_stride", [0, 8])
def test_verification_equals_references(out_stride):
    rng = np.random.default_rng(9)
    vocab = 12
    trees, offsets, parents, tokens = random_trees(rng, 5, vocab)
    nodes = int(offsets[-1])
    logits = torch.from_numpy(rng.standard_normal((nodes, vocab)).astype(np.float32) * 2)
    target = torch.softmax(logits, -1)
    draft = torch.softmax(torch.from_numpy(rng.standard_normal((nodes, vocab)).astype(np.float32)), -1)
    keys = ops.pack_rng_keys(torch.tensor(11), torch.arange(5), torch.tensor(0), torch.arange(5) * 10)
    results = {
        "greedy": ops.verify_greedy(offsets, parents, tokens, logits, out_stride),
        "tokens": ops.verify_greedy_tokens(offsets, parents, tokens, logits.argmax(-1).int(), out_stride),
        "stochastic": ops.verify_stochastic(offsets, parents, tokens, target, draft, keys, "without_replacement",
                                            out_stride),
        "no_draft": ops.verify_stochastic(offsets, parents, tokens, target, None, keys, "independent", out_stride),
    }
    for name, (out_tokens, out_path, accepted, status) in results.items():
        assert not status.any(), name
        for r, tree in enumerate(trees):
            a, b = int(offsets[r]), int(offsets[r + 1])
            if name == "greedy":
                ref = _core.verify_greedy(tree, logits[a:b].numpy())
            elif name == "tokens":
                ref = _core.verify_greedy_tokens(tree, logits[a:b].argmax(-1).int().numpy())
            else:
                d = draft[a:b].numpy() if name == "stochastic" else None
                ref = _core.verify_stochastic(tree, target[a:b].numpy(), d, "without_replacement", 11, r, 0, r * 10)
            n = ref[2]
            row_t = out_tokens[a:b] if out_stride == 0 else out_tokens[r]
            row_p = out_path[a:b] if out_stride == 0 else out_path[r]
            assert int(accepted[r]) == n, name
            assert row_t[:n + 1].tolist() == list(ref[0]) and row_p[:n + 1].tolist() == list(ref[1]), name
            assert (row_t[n + 1:] == -1).all() and (row_p[n + 1:] == -1).all(), name


def _indexed_draft(rng, offsets, parents, draft):
    """``draft``'s rows shuffled into a larger buffer among NaN rows, and the draft_index that
    finds them: -1 for the nodes without children (the draft loop's leaves), which need none."""
    nodes, vocab = draft.shape
    has_children = np.zeros(nodes, dtype=bool)
    for r in range(len(offsets) - 1):
        a, b = int(offsets[r]), int(offsets[r + 1])
        for v in range(a + 1, b):
            has_children[a + int(parents[v])] = True
    slots = rng.permutation(nodes + 5)[:nodes]
    buf = torch.full((nodes + 5, vocab), float("nan"))
    buf[slots[has_children]] = draft[torch.from_numpy(has_children)]
    return buf, torch.from_numpy(np.where(has_children, slots, -1).astype(np.int32))


def test_verify_stochastic_finds_draft_rows_through_draft_index():
    """draft_index: the draft rows where they lie (shuffled, leaves without a row) give the
    results of node-ordered rows; a node with children and no row is status 4 (kBadDraftRow)
    for its request alone."""
    rng = np.random.default_rng(21)
    vocab = 30
    _, offsets, parents, tokens = random_trees(rng, 6, vocab)
    nodes = int(offsets[-1])
    target = torch.softmax(torch.from_numpy(rng.standard_normal((nodes, vocab)).astype(np.float32) * 2), -1)
    draft = torch.softmax(torch.from_numpy(rng.standard_normal((nodes, vocab)).astype(np.float32) * 2), -1)
    keys = ops.pack_rng_keys(torch.tensor(5), torch.arange(6), torch.tensor(0), torch.arange(6) * 3)
    buf, index = _indexed_draft(rng, offsets, parents, draft)
    for sampling in ("without_replacement", "independent"):
        want = ops.verify_stochastic(offsets, parents, tokens, target, draft, keys, sampling)
        got = ops.verify_stochastic(offsets, parents, tokens, target, buf, keys, sampling, draft_index=index)
        assert not want[3].any()
        for w, g in zip(want, got):
            assert torch.equal(g, w), sampling
    r = next(r for r in range(6) if index[int(offsets[r])] >= 0)  # a request whose root has children
    broken = index.clone()
    broken[int(offsets[r])] = -1  # without its root's row, request r alone fails
    _, _, accepted, status = ops.verify_stochastic(offsets, parents, tokens, target, buf, keys, draft_index=broken)
    assert status.tolist() == [4 if q == r else 0 for q in range(6)] and accepted[r] == 0
    with pytest.raises(errors.InvalidArgumentError, match="draft_index and draft_totals need draft_probs"):
        ops.verify_stochastic(offsets, parents, tokens, target, None, keys, draft_index=index)
    with pytest.raises(errors.InvalidArgumentError, match="draft_index must have shape"):
        ops.verify_stochastic(offsets, parents, tokens, target, buf, keys, draft_index=index[1:])


def _sequential_totals(rows: torch.Tensor) -> torch.Tensor:
    """Each row's floats summed as doubles in id order (what the kernels' totals are on the CPU):
    the last entry of the CPU's running sum, a sequential scan."""
    return rows.cpu().double().cumsum(-1)[:, -1]


def test_row_totals_from_the_sampling_ops_feed_verify_stochastic():
    """totals: each written row's sum, from sampling_probs and sample_tokens_and_probs_out (both
    draws, the rows and tokens unchanged); verify_stochastic with totals (and draft_index) gives
    the results of summing the rows itself, and a bad total fails its request alone."""
    rng = np.random.default_rng(22)
    vocab = 40
    logits = torch.from_numpy(rng.standard_normal((9, vocab)).astype(np.float32) * 2)
    params = param_rows([PARAMS[i % len(PARAMS)] for i in range(9)])
    keys = ops.pack_rng_keys(torch.tensor(4), torch.arange(9), torch.tensor(0), torch.tensor(7))
    totals = torch.full((9,), -1.0, dtype=torch.float64)
    probs, _ = ops.sampling_probs(logits, params, totals=totals)
    assert torch.equal(probs, ops.sampling_probs(logits, params)[0])
    assert torch.equal(totals, _sequential_totals(probs))
    for gumbel in (False, True):
        rows, written = torch.empty(9, vocab), torch.full((9,), -1.0, dtype=torch.float64)
        drawn, _ = ops.sample_tokens_and_probs_out(logits, params, keys, rows, gumbel=gumbel, totals=written)
        assert torch.equal(rows, probs) and torch.equal(written, totals)
        assert torch.equal(drawn, ops.sample_tokens_and_probs_out(logits, params, keys, torch.empty(9, vocab),
                                                                  gumbel=gumbel)[0])
    _, offsets, parents, tokens = random_trees(rng, 6, vocab)
    nodes, batch = int(offsets[-1]), 6
    target = torch.softmax(torch.from_numpy(rng.standard_normal((nodes, vocab)).astype(np.float32) * 2), -1)
    draft = torch.softmax(torch.from_numpy(rng.standard_normal((nodes, vocab)).astype(np.float32) * 2), -1)
    t_totals, d_totals = _sequential_totals(target), _sequential_totals(draft)
    rkeys = ops.pack_rng_keys(torch.tensor(5), torch.arange(batch), torch.tensor(0), torch.arange(batch) * 3)
    buf, index = _indexed_draft(rng, offsets, parents, draft)
    b_totals = _sequential_totals(torch.nan_to_num(buf))
    for sampling in ("without_replacement", "independent"):
        for d, extra in ((draft, dict(draft_totals=d_totals)),
                         (buf, dict(draft_index=index, draft_totals=b_totals)), (None, {})):
            want = ops.verify_stochastic(offsets, parents, tokens, target, d, rkeys, sampling,
                                         draft_index=extra.get("draft_index"))
            got = ops.verify_stochastic(offsets, parents, tokens, target, d, rkeys, sampling, target_totals=t_totals,
                                        **extra)
            assert not want[3].any()
            for w, g in zip(want, got):
                assert torch.equal(g, w), (sampling, sorted(extra))
    bad = t_totals.clone()
    bad[int(offsets[1])] = float("nan")  # request 1's root
    status = ops.verify_stochastic(offsets, parents, tokens, target, draft, rkeys, target_totals=bad)[3]
    assert status.tolist() == [3 if r == 1 else 0 for r in range(batch)]
    with pytest.raises(errors.InvalidArgumentError, match="target_totals must be torch.float64"):
        ops.verify_stochastic(offsets, parents, tokens, target, draft, rkeys, target_totals=t_totals.float())
    with pytest.raises(errors.InvalidArgumentError, match="draft_totals must have shape"):
        ops.verify_stochastic(offsets, parents, tokens, target, draft, rkeys, draft_totals=d_totals[1:])
    with pytest.raises(errors.InvalidArgumentError, match="need draft_probs"):
        ops.verify_stochastic(offsets, parents, tokens, target, None, rkeys, draft_totals=d_totals)
    with pytest.raises(errors.InvalidArgumentError, match="totals must be torch.float64"):
        ops.sampling_probs(logits, params, totals=totals.float())


def _logits_case(rng, vocab, batch=6, dtype=torch.float32):
    """Random trees, the target's logits rows (``dtype``), per-request parameters (PARAMS in
    turn), draft rows, keys."""
    _, offsets, parents, tokens = random_trees(rng, batch, vocab)
    nodes = int(offsets[-1])
    logits = torch.from_numpy(rng.standard_normal((nodes, vocab)).astype(np.float32) * 2).to(dtype)
    per_request = [PARAMS[(r + 1) % len(PARAMS)] for r in range(batch)]
    draft = torch.softmax(logits.float() + torch.from_numpy(rng.standard_normal((nodes, vocab)).astype(np.float32)), -1)
    keys = ops.pack_rng_keys(torch.tensor(6), torch.arange(batch), torch.tensor(0), torch.arange(batch) * 2)
    return offsets, parents, tokens, logits, per_request, draft, keys


def test_verify_stochastic_logits_equals_verification_of_sampled_rows():
    """verify_stochastic_logits (the target planned from its logits in the walk) gives exactly
    verify_stochastic on sampling_probs' rows and totals, for float32 and bfloat16 logits, with
    and without draft rows, through draft_index with totals; a request's bad parameters (9) or
    a bad logit in a row its walk visits (3) fail it alone; the op's argument errors."""
    rng = np.random.default_rng(41)
    for dtype in (torch.float32, torch.bfloat16):
        offsets, parents, tokens, logits, per_request, draft, keys = _logits_case(rng, 50, dtype=dtype)
        sizes = (offsets[1:] - offsets[:-1]).tolist()
        node_params = param_rows([p for p, s in zip(per_request, sizes) for _ in range(s)])
        totals = torch.empty(int(offsets[-1]), dtype=torch.float64)
        probs, row_status = ops.sampling_probs(logits, node_params, totals=totals)
        assert not row_status.any()
        buf, index = _indexed_draft(rng, offsets, parents, draft)
        for sampling in ("without_replacement", "independent"):
            for d, extra in ((draft, {}), (None, {}),
                             (buf, dict(draft_index=index, draft_totals=_sequential_totals(torch.nan_to_num(buf))))):
                want = ops.verify_stochastic(offsets, parents, tokens, probs, d, keys, sampling, target_totals=totals,
                                             draft_index=extra.get("draft_index"))
                got = ops.verify_stochastic_logits(offsets, parents, tokens, logits, param_rows(per_request), d, keys,
                                                   sampling, **extra)
                assert not want[3].any()
                for w, g in zip(want, got):
                    assert torch.equal(g, w), (dtype, sampling, d is None, sorted(extra))
        # The logits rows through target_index, shuffled among NaN rows: the same results.
        nodes = int(offsets[-1])
        slots = torch.from_numpy(rng.permutation(nodes + 4)[:nodes].astype(np.int32))
        spread = torch.full((nodes + 4, logits.shape[1]), float("nan"), dtype=dtype)
        spread[slots.long()] = logits
        want = ops.verify_stochastic_logits(offsets, parents, tokens, logits, param_rows(per_request), draft, keys)
        got = ops.verify_stochastic_logits(offsets, parents, tokens, spread, param_rows(per_request), draft, keys,
                                           target_index=slots)
        for w, g in zip(want, got):
            assert torch.equal(g, w), dtype
        params = per_request[:]
        params[2] = (-1.0, 0, 1.0, 0.0)
        bad = logits.clone()
        bad[int(offsets[4]), 3] = float("nan")  # request 4's root: always visited
        status = ops.verify_stochastic_logits(offsets, parents, tokens, bad, param_rows(params), draft, keys)[3]
        assert status.tolist() == [9 if r == 2 else 3 if r == 4 else 0 for r in range(6)]
    op = ops.verify_stochastic_logits
    offsets, parents, tokens, logits, per_request, draft, keys = _logits_case(rng, 20)
    with pytest.raises(errors.InvalidArgumentError, match="target_params must have shape"):
        op(offsets, parents, tokens, logits, param_rows(per_request[:5]), draft, keys)
    with pytest.raises(errors.InvalidArgumentError, match="target_logits must"):
        op(offsets, parents, tokens, logits.double(), param_rows(per_request), draft, keys)
    with pytest.raises(errors.InvalidArgumentError, match="draft_probs has vocab"):
        op(offsets, parents, tokens, logits, param_rows(per_request), draft[:, 1:].contiguous(), keys)
    with pytest.raises(errors.InvalidArgumentError, match="need draft_probs"):
        op(offsets, parents, tokens, logits, param_rows(per_request), None, keys,
           draft_totals=torch.ones(len(draft), dtype=torch.float64))
    with pytest.raises(errors.InvalidArgumentError, match="rows for"):
        op(offsets, parents, tokens, logits[:-1], param_rows(per_request), draft, keys)
    with pytest.raises(errors.InvalidArgumentError, match="target_index must have shape"):
        op(offsets, parents, tokens, logits, param_rows(per_request), draft, keys,
           target_index=torch.zeros(3, dtype=torch.int32))


def test_gpu_verify_stochastic_logits_equals_cpu_op(cuda):
    """verify_stochastic_logits on the GPU (one block and a cluster per request; bfloat16 and
    float32 logits of a 151,936-token vocabulary) against the CPU op."""
    rng = np.random.default_rng(42)
    for dtype in (torch.bfloat16, torch.float32):
        offsets, parents, tokens, logits, per_request, draft, keys = _logits_case(rng, 151_936, batch=4, dtype=dtype)
        buf, index = _indexed_draft(rng, offsets, parents, draft)
        d_totals = _sequential_totals(torch.nan_to_num(buf))
        params = param_rows(per_request)
        want = ops.verify_stochastic_logits(offsets, parents, tokens, logits, params, buf, keys, draft_index=index,
                                            draft_totals=d_totals)
        reversed_rows = torch.arange(len(logits) - 1, -1, -1, dtype=torch.int32)
        for cluster in (False, True):
            got = ops.verify_stochastic_logits(*to(cuda, (offsets, parents, tokens, logits, params, buf, keys)),
                                               cluster=cluster, draft_index=index.to(cuda),
                                               draft_totals=d_totals.to(cuda))
            for w, g in zip(want, got):
                assert torch.equal(g.cpu(), w), (dtype, cluster)
            got = ops.verify_stochastic_logits(*to(cuda, (offsets, parents, tokens, logits.flip(0), params, buf,
                                                          keys)), cluster=cluster, draft_index=index.to(cuda),
                                               draft_totals=d_totals.to(cuda), target_index=reversed_rows.to(cuda))
            for w, g in zip(want, got):
                assert torch.equal(g.cpu(), w), (dtype, cluster, "target_index")


def test_gpu_verify_stochastic_draft_index_equals_cpu_op(cuda):
    """draft_index on the GPU (one block and a cluster per request) against the CPU op."""
    rng = np.random.default_rng(34)
    vocab = 151_936
    _, offsets, parents, tokens = random_trees(rng, 5, vocab, max_nodes=5)
    n = int(offsets[-1])
    target = torch.softmax(torch.from_numpy(rng.standard_normal((n, vocab)).astype(np.float32) * 3), -1)
    draft = torch.softmax(torch.from_numpy(rng.standard_normal((n, vocab)).astype(np.float32) * 3), -1)
    buf, index = _indexed_draft(rng, offsets, parents, draft)
    keys = ops.pack_rng_keys(torch.tensor(8), torch.arange(5), torch.tensor(0), torch.tensor(2))
    want = ops.verify_stochastic(offsets, parents, tokens, target, buf, keys, draft_index=index)
    for cluster in (False, True):
        got = ops.verify_stochastic(*to(cuda, (offsets, parents, tokens, target, buf, keys)), cluster=cluster,
                                    draft_index=index.to(cuda))
        for w, g in zip(want, got):
            assert torch.equal(g.cpu(), w), cluster
    # Totals from the GPU's own sums (the sampling ops' totals on the GPU: equal to a CPU sum up
    # to the order of additions) give the CPU's results too.
    for cluster in (False, True):
        t_totals = torch.empty(n, dtype=torch.float64, device=cuda)
        logits = torch.log(target).to(cuda)
        probs, _ = ops.sampling_probs(logits, param_rows([(1.0, 0, 1.0, 0.0)] * n).to(cuda), cluster, t_totals)
        torch.testing.assert_close(t_totals.cpu(), _sequential_totals(probs.cpu()), rtol=1e-12, atol=0)
        want = ops.verify_stochastic(offsets, parents, tokens, probs.cpu(), buf, keys, draft_index=index)
        got = ops.verify_stochastic(*to(cuda, (offsets, parents, tokens, probs, buf, keys)), cluster=cluster,
                                    draft_index=index.to(cuda), target_totals=t_totals,
                                    draft_totals=_sequential_totals(torch.nan_to_num(buf)).to(cuda))
        for w, g in zip(want, got):
            assert torch.equal(g.cpu(), w), cluster


# ---- errors ----


def test_bad_arguments_raise_invalid_argument():
    rng = np.random.default_rng(10)
    kc, vc, k, v, slots = kv_case(rng)
    with pytest.raises(errors.InvalidArgumentError, match="slot_mapping must be torch.int64"):
        ops.kv_write(kc, vc, k, v, slots.int())
    with pytest.raises(errors.InvalidArgumentError, match="caches' dtype"):
        ops.kv_write(kc, vc, k.double(), v, slots)
    with pytest.raises(errors.InvalidArgumentError, match="v_cache must have k_cache's shape"):
        ops.kv_write(kc, vc[:5], k, v, slots)
    q, kc, vc, table, starts, kv_lens, mask = attention_case(rng)
    with pytest.raises(errors.InvalidArgumentError, match="float32 only"):
        ops.tree_attention(q.bfloat16(), kc.bfloat16(), vc.bfloat16(), table, starts, kv_lens, mask)
    with pytest.raises(errors.InvalidArgumentError, match="block_table must be torch.int32"):
        ops.tree_attention(q, kc, vc, table.long(), starts, kv_lens, mask)
    with pytest.raises(errors.InvalidArgumentError, match="query_start must have shape"):
        ops.tree_attention(q, kc, vc, table, starts[:-1], kv_lens, mask)
    with pytest.raises(errors.InvalidArgumentError, match="all tensors must be on one device"):
        common_device("kv_write", k_cache=kc, slot_mapping=torch.empty(3, device="meta"))
    pos = torch.zeros(2, dtype=torch.int64)
    ids = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(errors.InvalidArgumentError, match="different tensors"):
        ops.draft_step_inputs_inplace(table[:2], pos, ids, ids, torch.empty(2, dtype=torch.int64),
                                      torch.empty(2, dtype=torch.int32), 4, 16)
    with pytest.raises(errors.InvalidArgumentError, match="draft_sampling"):
        _, offsets, parents, tokens = random_trees(rng, 1, 5)
        n = int(offsets[-1])
        ops.verify_stochastic(offsets, parents, tokens, torch.full((n, 5), 0.2), None,
                              ops.pack_rng_keys(torch.tensor(0), torch.tensor(0), torch.tensor(0), torch.tensor(0)),
                              "sometimes")


# ---- opcheck (schema, fake implementation, autograd registration, aot dispatch) ----


def opcheck_samples():
    rng = np.random.default_rng(11)
    kc, vc, k, v, slots = kv_case(rng)
    k5, v5 = paged_caches(rng, pages=12, layers=2)
    compact = (k5, v5, random_tables(rng, 2, 4, 12), torch.tensor([3, 0], dtype=torch.int32),
               torch.tensor([[0, 2, 5], [0, 1, -1]], dtype=torch.int32), torch.tensor([2, 1], dtype=torch.int32))
    table = random_tables(rng, 2, 4, 16)
    pos = torch.tensor([3, 8])
    q, akc, avc, atable, starts, kv_lens, mask = attention_case(rng)
    logits = torch.from_numpy(rng.standard_normal((3, 20)).astype(np.float32))
    params = param_rows(PARAMS[:3])
    keys = ops.pack_rng_keys(torch.tensor(1), torch.arange(3), torch.tensor(0), torch.tensor(4))
    _, offsets, parents, tokens = random_trees(rng, 2, 20)
    n = int(offsets[-1])
    target = torch.softmax(torch.from_numpy(rng.standard_normal((n, 20)).astype(np.float32)), -1)
    return [
        (ops.kv_write, (kc, vc, k, v, slots)),
        (ops.kv_compact, compact),
        (ops.slot_mapping, (table, torch.tensor([0, 1, 1], dtype=torch.int32),
                            torch.tensor([2, 0, 9], dtype=torch.int32), 4)),
        (ops.draft_step_inputs, (table, pos, torch.tensor([1, 2]), 4, 16, 1, torch.tensor([2, 1], dtype=torch.int32))),
        (ops.draft_step_inputs_inplace, (table, pos.clone(), torch.tensor([1, 2]), torch.empty(2, dtype=torch.int64),
                                         torch.empty(2, dtype=torch.int64), torch.empty(2, dtype=torch.int32), 4, 16)),
        (ops.tree_attention, (q, akc, avc, atable, starts, kv_lens, mask)),
        (ops.sample_tokens, (logits, params, keys)),
        (ops.sampling_probs, (logits, params)),
        (ops.verify_greedy, (offsets, parents, tokens, target, 0)),
        (ops.verify_greedy_tokens, (offsets, parents, tokens, target.argmax(-1).int(), 6)),
        (ops.verify_stochastic, (offsets, parents, tokens, target, target.flip(-1).contiguous(),
                                 ops.pack_rng_keys(torch.tensor(1), torch.arange(2), torch.tensor(0), torch.tensor(0)),
                                 "independent", 0)),
        (ops.sample_tokens_and_probs, (logits, params, keys)),
        (ops.sample_tokens_and_probs_out, (logits, params, keys, torch.zeros(3, 20))),
        (ops.sample_tokens, (logits, params, keys, False, True)),  # the Gumbel-max draws
        (ops.sample_tokens_and_probs, (logits, params, keys, False, True)),
        (ops.sample_tokens_and_probs_out, (logits, params, keys, torch.zeros(3, 20), False, True)),
        (ops.verify_stochastic, (offsets, parents, tokens, target, target.flip(-1).contiguous(),
                                 ops.pack_rng_keys(torch.tensor(1), torch.arange(2), torch.tensor(0), torch.tensor(0)),
                                 "independent", 0, False, torch.arange(n, dtype=torch.int32).flip(0).contiguous(),
                                 torch.ones(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64))),
        (ops.sampling_probs, (logits, params, False, torch.zeros(3, dtype=torch.float64))),
        (ops.sample_tokens_and_probs_out, (logits, params, keys, torch.zeros(3, 20), False, False,
                                           torch.zeros(3, dtype=torch.float64))),
        (ops.verify_stochastic_logits, (offsets, parents, tokens, torch.log(target), params[:2],
                                        target.flip(-1).contiguous(),
                                        ops.pack_rng_keys(torch.tensor(1), torch.arange(2), torch.tensor(0),
                                                          torch.tensor(0)), "independent", 0)),
        (ops.verify_stochastic_logits, (offsets, parents, tokens, torch.log(target).bfloat16(), params[1:],
                                        target.flip(-1).contiguous(),
                                        ops.pack_rng_keys(torch.tensor(1), torch.arange(2), torch.tensor(0),
                                                          torch.tensor(0)), "without_replacement", 0, False,
                                        torch.arange(n, dtype=torch.int32).flip(0).contiguous(),
                                        torch.ones(n, dtype=torch.float64))),
    ]


@pytest.mark.parametrize("index", range(21))
def test_opcheck(index):
    op, args = opcheck_samples()[index]
    torch.library.opcheck(op, args)


# ---- GPU: the op on cuda equals the op on cpu ----


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not ops.HAS_CUDA_KERNELS:
        pytest.skip("specd built without CUDA kernels")
    return torch.device("cuda")


def to(device, args):
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def every_arg(op, args, **kwargs):
    """``args`` and ``kwargs`` as every parameter of ``op``, positionally, defaults filled in.
    Torch before 2.13 bumps the versions of an op's mutated arguments by their schema index
    among the arguments as passed, so an optional mutated argument left to its default (the
    sampling ops' ``totals``) fails with an IndexError there; 2.13 fills the defaults first.
    The GPU tests pass every argument so that they also run where the lent GPU machine has an
    older torch (2.11 in the seventh GPU session)."""
    bound = inspect.signature(op._init_fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.args


@pytest.mark.parametrize("index", [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 19, 20])
def test_gpu_op_equals_cpu_op_exactly(cuda, index):
    op, args = opcheck_samples()[index]
    cpu_args, gpu_args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args), to(cuda, args)
    want, got = op(*every_arg(op, cpu_args)), op(*every_arg(op, gpu_args))
    torch.cuda.synchronize()
    for w, g in zip(want if isinstance(want, tuple) else (want,) * (want is not None),
                    got if isinstance(got, tuple) else (got,) * (got is not None)):
        if w.dtype == torch.float32:
            torch.testing.assert_close(g.cpu(), w, rtol=2e-6, atol=1e-7)  # probability rows: one float ulp
        else:
            assert torch.equal(g.cpu(), w)
    for c, g in zip(cpu_args, gpu_args):  # mutated caches and buffers
        if isinstance(c, torch.Tensor):
            assert torch.equal(g.cpu(), c)


SAMPLING_OPS = {"sample_tokens": 6, "sampling_probs": 7, "sample_tokens_and_probs": 11,
                "sample_tokens_and_probs_out": 12}  # their indices in opcheck_samples()


def test_sampling_cluster_flag_keeps_the_cpu_reference():
    for name, index in SAMPLING_OPS.items():
        op, args = opcheck_samples()[index]
        plain, clustered = op(*args), op(*args, cluster=True)
        for p, c in zip(plain, clustered):
            assert torch.equal(p, c), name


def test_gpu_clustered_verify_stochastic_equals_cpu_op(cuda):
    """verify_stochastic(cluster=True) (a thread-block cluster per request on sm_90+) against the
    CPU op on trees over 151,936-token rows, with and without draft rows."""
    rng = np.random.default_rng(33)
    _, offsets, parents, tokens = random_trees(rng, 6, 151_936, max_nodes=5)
    n = int(offsets[-1])
    target = torch.softmax(torch.from_numpy(rng.standard_normal((n, 151_936)).astype(np.float32) * 3), -1)
    draft = torch.softmax(torch.from_numpy(rng.standard_normal((n, 151_936)).astype(np.float32) * 3), -1)
    keys = ops.pack_rng_keys(torch.tensor(3), torch.arange(6), torch.tensor(0), torch.tensor(9))
    for d in (draft, None):
        want = ops.verify_stochastic(offsets, parents, tokens, target, d, keys)
        got = ops.verify_stochastic(*to(cuda, (offsets, parents, tokens, target, d, keys)), cluster=True)
        for w, g in zip(want, got):
            assert torch.equal(g.cpu(), w)
    if torch.cuda.get_device_capability(cuda)[0] >= 9:
        assert _core.verify_clusters_available()


@pytest.mark.parametrize("cluster", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_verify_greedy_equals_cpu_op(cuda, dtype, cluster):
    """verify_greedy on the GPU, one 1024-thread block or (cluster=True, sm_90+) a cluster of 8
    blocks per request, against the CPU op on trees over 151,936-token rows with many exact
    ties (bfloat16 rows keep their raw words in flight), in both output layouts."""
    rng = np.random.default_rng(35)
    _, offsets, parents, tokens = random_trees(rng, 9, 151_936, max_nodes=6)
    n = int(offsets[-1])
    logits = torch.from_numpy(rng.integers(0, 40, (n, 151_936)).astype(np.float32) / 8).to(dtype)
    logits[3, 151_935] = 9.0  # the top in the last load group
    best = logits.float().argmax(-1)  # the lowest id among the maxima
    tokens = tokens.clone()
    for r in range(9):  # most drafts follow the target, so walks go deep
        a, b = int(offsets[r]), int(offsets[r + 1])
        for v in range(1, b - a):
            if rng.random() < 0.8:
                tokens[a + v] = best[a + int(parents[a + v])]
    for out_stride in (0, 8):
        want = ops.verify_greedy(offsets, parents, tokens, logits, out_stride)
        got = ops.verify_greedy(*to(cuda, (offsets, parents, tokens, logits)), out_stride, cluster=cluster)
        for w, g in zip(want, got):
            assert torch.equal(g.cpu(), w), (dtype, cluster, out_stride)


def test_verify_greedy_cluster_flag_keeps_the_cpu_reference():
    rng = np.random.default_rng(36)
    _, offsets, parents, tokens = random_trees(rng, 4, 50)
    logits = torch.from_numpy(rng.standard_normal((int(offsets[-1]), 50)).astype(np.float32))
    for p, c in zip(ops.verify_greedy(offsets, parents, tokens, logits),
                    ops.verify_greedy(offsets, parents, tokens, logits, cluster=True)):
        assert torch.equal(p, c)


@pytest.mark.parametrize("name", sorted(SAMPLING_OPS))
def test_gpu_cluster_rows_equals_cpu_op(cuda, name):
    """cluster=True (a thread-block cluster per row on sm_90+) against the CPU op, on rows of
    the real vocabulary size where eight blocks share each pass."""
    op, _ = opcheck_samples()[SAMPLING_OPS[name]]
    rng = np.random.default_rng(31)
    logits = torch.from_numpy(rng.standard_normal((len(PARAMS), 151_936)).astype(np.float32) * 3)
    params = param_rows(PARAMS)
    keys = ops.pack_rng_keys(torch.tensor(5), torch.arange(len(PARAMS)), torch.tensor(0), torch.tensor(2))
    args = (logits, params) if name == "sampling_probs" else (logits, params, keys)
    if name == "sample_tokens_and_probs_out":
        args = args + (torch.zeros(len(PARAMS), 151_936),)
    want = op(*every_arg(op, args))
    got = op(*every_arg(op, to(cuda, args), cluster=True))
    torch.cuda.synchronize()
    for w, g in zip(want, got):
        if w.dtype == torch.float32:
            torch.testing.assert_close(g.cpu(), w, rtol=2e-6, atol=1e-7)
        else:
            assert torch.equal(g.cpu(), w)
    if torch.cuda.get_device_capability(cuda)[0] >= 9:
        assert _core.sampling_clusters_available()


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_tree_attention_close_to_cpu(cuda, dtype, grouped):
    rng = np.random.default_rng(12)
    q, kc, vc, table, starts, kv_lens, mask = attention_case(rng, seqs=5)
    q, kc, vc = (t.to(dtype) for t in (q, kc, vc))
    # The CPU reference (float32 only) on the same 16-bit-rounded inputs: the kernel accumulates
    # in float, so only its rounding of the output (and of the scores) is left to tolerate.
    want = ops.tree_attention(q.float(), kc.float(), vc.float(), table, starts, kv_lens, mask)
    got = ops.tree_attention(*to(cuda, (q, kc, vc, table, starts, kv_lens, mask)), grouped=grouped)
    assert got.dtype == dtype and got.shape == want.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float().cpu(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_tree_attention_tree_lens_close_to_cpu(cuda, dtype, grouped):
    """Both kernels with tree_lens (only the newest nodes as queries) against the CPU reference."""
    rng = np.random.default_rng(17)
    part, tree_lens, _ = newest_only(attention_case(rng, seqs=5), rng)
    q, kc, vc, table, starts, kv_lens, mask = part
    q, kc, vc = (t.to(dtype) for t in (q, kc, vc))
    want = ops.tree_attention(q.float(), kc.float(), vc.float(), table, starts, kv_lens, mask, tree_lens=tree_lens)
    got = ops.tree_attention(*to(cuda, (q, kc, vc, table, starts, kv_lens, mask)), grouped=grouped,
                             tree_lens=tree_lens.to(cuda))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float().cpu(), want, rtol=tol, atol=tol)


def long_history_case(rng, seqs=2, history=900, q_heads=14, kv_heads=2, dim=128, block=16):
    """Requests with long histories (several KV splits for the grouped kernel) and small trees,
    Qwen2.5-like GQA (7 query heads per kv head), pages shuffled over the pool."""
    trees, _, _, _ = random_trees(rng, seqs, 50, max_nodes=9)
    kv_lens = [history + int(rng.integers(0, 64)) + len(t) for t in trees]
    width = max(-(-n // block) for n in kv_lens)
    pages = rng.permutation(seqs * width).reshape(seqs, width)
    kc = torch.from_numpy(rng.standard_normal((seqs * width, block, kv_heads, dim)).astype(np.float32))
    vc = torch.from_numpy(rng.standard_normal((seqs * width, block, kv_heads, dim)).astype(np.float32))
    starts = torch.tensor(np.concatenate([[0], np.cumsum([len(t) for t in trees])]), dtype=torch.int32)
    q = torch.from_numpy(rng.standard_normal((int(starts[-1]), q_heads, dim)).astype(np.float32))
    mask = torch.from_numpy(np.concatenate([t.ancestor_mask() for t in trees]).view(np.int64))
    return (q, kc, vc, torch.from_numpy(pages.astype(np.int32)), starts, torch.tensor(kv_lens, dtype=torch.int32),
            mask)


def test_tree_attention_grouped_flag_keeps_the_cpu_reference():
    case = long_history_case(np.random.default_rng(14), history=200, dim=16)
    assert torch.equal(ops.tree_attention(*case, grouped=True), ops.tree_attention(*case))


@pytest.mark.parametrize("seqs", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_grouped_tree_attention_over_long_histories(cuda, dtype, seqs):
    """The split, head-grouped kernel against the CPU reference where its plan splits the keys
    (batch 1: up to 64 splits) and against the per-head kernel on the same device."""
    q, kc, vc, table, starts, kv_lens, mask = long_history_case(np.random.default_rng(15 + seqs), seqs=seqs)
    q, kc, vc = (t.to(dtype) for t in (q, kc, vc))
    want = ops.tree_attention(q.float(), kc.float(), vc.float(), table, starts, kv_lens, mask)
    args = to(cuda, (q, kc, vc, table, starts, kv_lens, mask))
    got = ops.tree_attention(*args, grouped=True)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float().cpu(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(got.float(), ops.tree_attention(*args).float(), rtol=tol, atol=tol)


def test_gpu_kv_write_bf16_on_strided_views(cuda):
    rng = np.random.default_rng(13)
    kc, vc, k, v, slots = kv_case(rng, torch.bfloat16, strided=True)
    pool = kc._base.to(cuda)
    ops.kv_write(kc, vc, k, v, slots)
    ops.kv_write(pool[:, 1, 0], pool[:, 1, 1], *to(cuda, (k, v, slots)))
    assert torch.equal(pool.cpu(), kc._base)
