"""The engine's batched verification inputs (engine/batch_verify.py) against the per-request
CPU path they replace: greedy requests follow their target argmax; sampled requests, with and
without draft distributions, in one step, must give exactly what ``sampling_probs`` then
``verify`` give for each request alone with the key (seed, request, step 0, position =
length), verified from the logits (the default) or from probability rows. On a GPU the same
batch runs through the CUDA kernels."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specd import _core
from specd.engine.batch_verify import _draft_rows, verify_inputs
from specd.engine.params import SamplingParams
from specd.errors import InvalidArgumentError
from specd.verification import TokenTree, verify, verify_greedy_tokens

VOCAB = 24


def _item(rid, params, length, seed, rng_request):
    request = SimpleNamespace(id=rid, params=params, length=length, rng_seed=seed, rng_request=rng_request)
    return SimpleNamespace(request=request)


def _tree(rng, size, chain):
    tree = TokenTree(int(rng.integers(VOCAB)))
    for v in range(1, size):
        parent = v - 1 if chain else int(rng.integers(0, v))
        used = {int(tree.tokens[c]) for c in range(len(tree)) if int(tree.parents[c]) == parent}
        tree.add_node(parent, int(rng.choice([t for t in range(VOCAB) if t not in used])))
    return tree


def _case(seed, device="cpu"):
    """Seven requests: greedy, sampled with draft distributions (chains), sampled model-free
    (trees), with varied sampling parameters and a seed above 2**63. Drafts are sometimes the
    target's likely tokens so that some are accepted."""
    rng = np.random.default_rng(seed)
    specs = [  # (params, size, chain, drafted)
        (SamplingParams(temperature=0.0), 4, False, False),
        (SamplingParams(temperature=1.0), 3, True, True),
        (SamplingParams(temperature=0.7, top_k=5), 5, True, True),
        (SamplingParams(temperature=1.3, top_p=0.8), 4, False, False),
        (SamplingParams(temperature=0.9, top_k=8, top_p=0.9, min_p=0.05), 1, True, False),
        (SamplingParams(temperature=0.0), 2, True, False),
        (SamplingParams(temperature=1.0, min_p=0.1), 6, False, False),
    ]
    items, trees, dists, rows = [], {}, {}, []
    for rid, (params, size, chain, drafted) in enumerate(specs):
        seed_ = 2**64 - 5 if rid == 2 else int(rng.integers(2**40))
        items.append(_item(rid, params, int(rng.integers(5, 50)), seed_, rid if rid % 2 else 0))
        trees[rid] = _tree(rng, size, chain)
        logits = rng.standard_normal((size, VOCAB)).astype(np.float32) * 2
        for v in range(1, size):  # make a node's token likely after its parent, half of the time
            if rng.random() < 0.5:
                logits[int(trees[rid].parents[v]), int(trees[rid].tokens[v])] += 4
        rows.append(logits)
        if drafted:
            q = torch.softmax(torch.from_numpy(rng.standard_normal((size, VOCAB)).astype(np.float32)), -1)
            dists[rid] = q.to(device)
    return items, trees, dists, torch.from_numpy(np.concatenate(rows)).to(device)


def _reference(items, trees, dists, logits):
    out, row = {}, 0
    host = logits.float().cpu().numpy()
    for it in items:
        req, tree = it.request, trees[it.request.id]
        rows = host[row:row + len(tree)]
        row += len(tree)
        if req.params.greedy:
            out[req.id] = verify_greedy_tokens(rows.argmax(-1), tree)
            continue
        p = req.params
        probs = _core.sampling_probs(rows, float(p.temperature), p.top_k, float(p.top_p), float(p.min_p))
        q = dists[req.id].cpu().numpy() if req.id in dists else None
        out[req.id] = verify(probs, tree, q, seed=req.rng_seed, request=req.rng_request, step=0, position=req.length)
    return out


def _check(items, trees, dists, logits, from_logits=True):
    got = verify_inputs(items, trees, logits, dists, from_logits=from_logits)
    want = _reference(items, trees, dists, logits)
    accepted = 0
    for it in items:
        rid = it.request.id
        g, w = got[rid].verify(trees[rid]), want[rid]
        assert g.num_accepted == w.num_accepted, rid
        assert list(g.tokens) == list(w.tokens) and list(g.path) == list(w.path), rid
        assert (got[rid].argmax is not None) == it.request.params.greedy
        accepted += g.num_accepted
    return accepted


@pytest.mark.parametrize("from_logits", [True, False])
def test_batched_verification_equals_the_per_request_path(from_logits):
    """Sampled requests verified from the logits (verify_stochastic_logits, the default) and
    from probability rows (sampling_probs, then verify_stochastic) give the reference's results."""
    accepted = sum(_check(*_case(seed), from_logits=from_logits) for seed in range(20))
    assert accepted > 20  # the cases accept drafts, so paths and bonus tokens are compared too


def test_a_step_with_only_one_kind_of_request():
    items, trees, dists, logits = _case(3)
    sizes = [len(trees[it.request.id]) for it in items]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for keep in ([1, 2], [3, 6], [0, 5], [4]):  # drafted only, model-free only, greedy only, one row
        sub = [items[i] for i in keep]
        rows = torch.cat([logits[starts[i]:starts[i + 1]] for i in keep])
        _check(sub, trees, {k: v for k, v in dists.items() if k in keep}, rows)


def test_draft_rows_left_in_the_runners_buffer_are_read_in_place():
    """The draft graph runner leaves a call's distributions in one [steps, batch, vocab] buffer
    and hands out views (no leaf rows): verification reads them there through draft_index, with
    no copy, and gives the results of separate node-ordered rows."""
    items, trees, dists, logits = _case(11)
    drafted = sorted(dists)
    buf = torch.full((6, len(drafted) + 2, VOCAB), float("nan"))  # junk around the rows used
    views = {}
    for c, rid in enumerate(drafted):
        k = len(trees[rid]) - 1  # a chain's nodes with children
        buf[1:k + 1, c + 1] = dists[rid][:k]
        views[rid] = buf[1:k + 1, c + 1]
    offsets = np.array([0] + list(np.cumsum([len(trees[r]) for r in drafted])), dtype=np.int32)
    base, index = _draft_rows([views[r] for r in drafted], offsets)
    assert base.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()  # no copy
    for i, rid in enumerate(drafted):
        k = len(trees[rid]) - 1
        rows = index[offsets[i]:offsets[i + 1]]
        assert rows[-1] == -1  # the leaf has no row
        assert torch.equal(base[torch.from_numpy(rows[:k]).long()], dists[rid][:k])
    got = verify_inputs(items, trees, logits, views)
    want = _reference(items, trees, dists, logits)
    for it in items:
        g, w = got[it.request.id].verify(trees[it.request.id]), want[it.request.id]
        assert list(g.tokens) == list(w.tokens) and list(g.path) == list(w.path), it.request.id
    # Rows of separate tensors are concatenated, each request's from its first node.
    separate = [dists[r][:len(trees[r]) - 1].clone() for r in drafted]
    cat, index = _draft_rows(separate, offsets)
    assert cat.untyped_storage().data_ptr() not in {d.untyped_storage().data_ptr() for d in separate}
    assert torch.equal(cat[torch.from_numpy(index[index >= 0]).long()], torch.cat(separate))


def test_bfloat16_logits_are_read_as_their_float32_values():
    items, trees, dists, logits = _case(5)
    _check(items, trees, dists, logits.bfloat16())


def _device_or_skip(device):
    if device == "cuda":
        from specd.ops import HAS_CUDA_KERNELS
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU (the kernels' path)")
        if not HAS_CUDA_KERNELS:
            pytest.skip("specd was built without its CUDA kernels")
    return device


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_fail_only_their_request(device, bad):
    """A NaN or +inf logit in a greedy (0: its leaf's row), drafted (1), model-free (6) or
    draft-less (4: its tree is the root alone) request's rows (the sampled ones: their root's
    row, which every walk reads): that request's VerifyInputs carries an error naming it; the
    others verify as before."""
    items, trees, dists, logits = _case(7, _device_or_skip(device))
    starts = np.concatenate([[0], np.cumsum([len(trees[it.request.id]) for it in items])])
    failing = (0, 1, 4, 6)
    for rid in failing:
        logits[int(starts[rid]) + (len(trees[rid]) - 1 if rid == 0 else 0), 3] = bad
    got = verify_inputs(items, trees, logits, dists)
    for rid in failing:
        assert got[rid].error.startswith(f"request {rid}: verification failed")
        with pytest.raises(InvalidArgumentError, match=f"request {rid}: verification failed"):
            got[rid].verify(trees[rid])
    keep = [i for i in range(len(items)) if i not in failing]
    rows = torch.cat([logits[int(starts[i]):int(starts[i + 1])] for i in keep])
    want = _reference([items[i] for i in keep], trees, dists, rows)
    for i in keep:
        assert got[i].error is None and list(got[i].verify(trees[i]).tokens) == list(want[i].tokens)


def test_sampled_rows_outside_the_walk_are_not_read():
    """Verified from the logits, a sampled request's rows are planned only where its walk goes:
    a NaN in a node it does not visit changes nothing (as for greedy verification on the
    device); verified from probability rows (from_logits=False) every row is planned, and the
    request fails."""
    for seed in range(30):
        items, trees, dists, logits = _case(seed)
        starts = np.concatenate([[0], np.cumsum([len(trees[it.request.id]) for it in items])])
        clean = verify_inputs(items, trees, logits, dists)
        # a sampled request whose walk left some of its nodes unvisited
        off_path = [(it.request.id, v) for it in items if not it.request.params.greedy
                    for v in range(len(trees[it.request.id]))
                    if v not in clean[it.request.id].verify(trees[it.request.id]).path]
        if off_path:
            break
    rid, v = off_path[0]
    logits[int(starts[rid]) + v, 2] = float("nan")
    got = verify_inputs(items, trees, logits, dists)
    assert got[rid].error is None
    assert list(got[rid].verify(trees[rid]).tokens) == list(clean[rid].verify(trees[rid]).tokens)
    assert verify_inputs(items, trees, logits, dists, from_logits=False)[rid].error.startswith(
        f"request {rid}: verification failed")


def test_a_greedy_row_without_a_finite_logit_fails():
    items, trees, dists, logits = _case(2)
    logits[1] = -float("inf")  # request 0's second row
    got = verify_inputs(items, trees, logits, dists)
    assert "request 0: verification failed: the target's logits rows [1]" in got[0].error
    assert all(got[it.request.id].error is None for it in items[1:])


def test_batched_verification_on_the_gpu_equals_the_cpu_path():
    _device_or_skip("cuda")
    accepted = sum(_check(*_case(seed, "cuda")) for seed in range(20))
    assert accepted > 20


def _roots_case(seed, device="cpu"):
    """Twelve requests without drafts (root-only trees), sampled with varied parameters, and a
    greedy one."""
    rng = np.random.default_rng(seed)
    choices = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.6, top_k=4),
               SamplingParams(temperature=1.4, top_p=0.7), SamplingParams(temperature=0.8, min_p=0.2),
               SamplingParams(temperature=0.0)]
    items = [_item(rid, choices[rid % len(choices)], int(rng.integers(3, 90)), int(rng.integers(2**40)), rid)
             for rid in range(13)]
    trees = {rid: TokenTree(int(rng.integers(VOCAB))) for rid in range(13)}
    logits = torch.from_numpy(rng.standard_normal((13, VOCAB)).astype(np.float32) * 2).to(device)
    return items, trees, {}, logits


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_requests_without_drafts_under_both_draws(device):
    """Root-only trees: by default exactly the per-request path's bonus token (sampling_probs
    then verify on the root); with gumbel=True one ``specd::sample_tokens`` call with the
    Gumbel-max draw (another token for some seeds, always one the rules keep; greedy requests
    unchanged), and ``_sample_roots``' inverse-CDF form gives the default's tokens. A NaN row
    fails its request alone."""
    dev = _device_or_skip(device)
    for seed in range(5):
        items, trees, dists, logits = _roots_case(seed, dev)
        want = _reference(items, trees, dists, logits)
        got = verify_inputs(items, trees, logits, dists)
        gumbel = verify_inputs(items, trees, logits, dists, gumbel=True)
        differs = False
        for it in items:
            rid, p = it.request.id, it.request.params
            g = got[rid].verify(trees[rid])
            assert (g.num_accepted, list(g.tokens), list(g.path)) == (0, list(want[rid].tokens), [0]), rid
            gg = gumbel[rid].verify(trees[rid])
            assert gg.num_accepted == 0 and list(gg.path) == [0]
            probs = _core.sampling_probs(logits[rid:rid + 1].float().cpu().numpy(), float(p.temperature), p.top_k,
                                         float(p.top_p), float(p.min_p))[0]
            assert probs[int(gg.tokens[0])] > 0, rid
            if p.greedy:
                assert list(gg.tokens) == list(g.tokens)
            differs = differs or list(gg.tokens) != list(g.tokens)
        assert differs
        from specd.engine.batch_verify import _sample_roots
        group = [(it, (i, i + 1)) for i, it in enumerate(items)]
        direct = _sample_roots(group, logits, False, False)
        assert [list(d.tokens) for d in direct] == [list(want[it.request.id].tokens) for it in items]
    items, trees, dists, logits = _roots_case(9, dev)
    logits[2, 5] = float("nan")
    got = verify_inputs(items, trees, logits, dists, gumbel=True)
    assert got[2].error.startswith("request 2: verification failed (sampling status 2)")
    assert all(got[it.request.id].error is None for it in items if it.request.id != 2)



def test_sampling_words_are_the_packing_ops_words():
    """The per-request parameters and keys packed for a sampled verification (struct-packed on
    the host) are the words of specd.ops.pack_sampling_params and pack_rng_keys: each request's
    parameters repeated over its tree's rows, its key (seed, request, step 0, length), for
    edge values (64-bit seeds, 40-bit request ids, positions past 32 bits, the largest top_k,
    temperatures 0 and tiny)."""
    from specd.engine.batch_verify import _sampling_words
    from specd.ops import pack_rng_keys, pack_sampling_params

    rng = np.random.default_rng(41)
    reqs = [SimpleNamespace(params=SimpleNamespace(temperature=[0.0, 0.7, 1.3, 1e-9][i % 4],
                                                   top_k=[0, 1, 50, 2**31 - 1][i % 4], top_p=float(rng.random()),
                                                   min_p=float(rng.random()) / 3),
                            rng_seed=int(rng.integers(0, 2**63)) * 2 + i % 2, rng_request=int(rng.integers(0, 2**40)),
                            length=int(rng.integers(0, 2**33)))
            for i in range(7)]
    for sizes in (np.ones(7, dtype=np.int64), rng.integers(1, 9, 7)):
        params, keys = _sampling_words(reqs, sizes, torch.device("cpu"))

        def per_row(values, dtype):
            return torch.from_numpy(np.repeat(np.asarray(values, dtype=dtype), sizes))

        p = [r.params for r in reqs]
        want_params = pack_sampling_params(per_row([x.temperature for x in p], np.float64),
                                           per_row([x.top_k for x in p], np.int64),
                                           per_row([x.top_p for x in p], np.float64),
                                           per_row([x.min_p for x in p], np.float64))
        want_keys = pack_rng_keys(torch.from_numpy(np.array([r.rng_seed for r in reqs], dtype=np.uint64).view(np.int64)),
                                  torch.tensor([r.rng_request for r in reqs]), torch.tensor(0),
                                  torch.tensor([r.length for r in reqs]))
        assert torch.equal(params, want_params)
        assert torch.equal(keys, want_keys)


def test_packed_words_of_no_rows_are_empty():
    from specd.engine.draft_sampling import pack_words

    params, keys = pack_words([], [], torch.device("cpu"))
    assert params.shape == (0, 4) and keys.shape == (0, 3) and params.dtype == keys.dtype == torch.int64
    params, keys = pack_words([(0.7, 5, 0.9, 0.0)], [], torch.device("cpu"), [0])
    assert params.shape == (0, 4) and keys.shape == (0, 3)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_queued_greedy_rows_follow_argmax(device, dtype):
    """The greedy rows' queued argmax and finiteness (one torch.max) equal torch.argmax's
    rules and the finiteness of the chosen logit: the lowest id among exact ties, a NaN's id
    (the first NaN) where a row holds one, +inf chosen and not finite, all -inf not finite."""
    from specd.engine.batch_verify import _greedy_rows_in_place, _queue_greedy_rows

    dev = torch.device(_device_or_skip(device))
    g = torch.Generator().manual_seed(3)
    for _ in range(40):
        rows, vocab = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 400, (1,), generator=g))
        x = torch.randint(0, 4, (rows, vocab), generator=g).to(torch.float32)  # many exact ties
        for r in range(rows):
            kind, at = int(torch.randint(0, 6, (1,), generator=g)), int(torch.randint(0, vocab, (1,), generator=g))
            if kind == 0:
                x[r, at] = float("nan")
            elif kind == 1:
                x[r, at] = float("inf")
            elif kind == 2:
                x[r] = float("-inf")
            elif kind == 3:
                x[r, at], x[r, (at + 1) % vocab] = float("nan"), float("nan")
        x = x.to(dtype).to(dev)
        got = _queue_greedy_rows(x)
        if got is None:  # CPU float32 rows: read in place by numpy instead
            assert dev.type == "cpu" and dtype == torch.float32
            argmax, finite = _greedy_rows_in_place(x)
            got = torch.cat([torch.from_numpy(argmax).long(), torch.from_numpy(finite).long()])
        want = torch.argmax(x.cpu().float(), dim=-1)
        finite = torch.isfinite(x.cpu().float()[torch.arange(rows), want]).long()
        assert torch.equal(got.cpu(), torch.cat([want, finite])), x
