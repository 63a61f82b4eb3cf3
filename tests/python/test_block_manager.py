"""BlockManager through the Python binding: worked examples, errors, zero-copy exports."""

import gc

import numpy as np
import pytest

import specd
from specd import errors


def make(num_pages=8, block=4, draft_bytes=None):
    models = [("target", 6)]
    if draft_bytes:
        models.append(("draft", draft_bytes))
    return specd.BlockManager(page_bytes=block * 6, num_pages=num_pages, models=models)


def grow(bm, seq, n, model=0):
    bm.reserve(seq, n, model=model)
    bm.commit(seq, n, model=model)


def test_construction_and_block_sizes():
    bm = make(draft_bytes=4)
    assert bm.model_names == ["target", "draft"]
    assert bm.block_size() == 4 and bm.block_size("draft") == 6 and bm.block_size(1) == 6
    assert bm.page_bytes == 24 and bm.num_pages == 8 and bm.num_free_pages == 8
    assert bm.kv_bytes_per_token("draft") == 4
    assert bm.pages_for_tokens(9) == 3 and bm.pages_for_tokens(9, model="draft") == 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(page_bytes=0, num_pages=4, models=[("target", 4)]), "page_bytes"),
        (dict(page_bytes=64, num_pages=0, models=[("target", 4)]), "num_pages"),
        (dict(page_bytes=64, num_pages=4, models=[]), "models"),
        (dict(page_bytes=64, num_pages=4, models=[("t", 4), ("t", 2)]), "twice"),
        (dict(page_bytes=8, num_pages=4, models=[("target", 9)]), "holds no block"),
    ],
)
def test_invalid_configuration_raises_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        specd.BlockManager(**kwargs)


def test_reservations_at_before_and_across_block_boundaries():
    bm = make()
    bm.add_sequence(1)
    grow(bm, 1, 3)
    assert list(bm.reserve(1, 1).slots) == [3]  # last slot of page 0
    bm.commit(1, 1)
    assert list(bm.reserve(1, 1).slots) == [4]  # exactly at the boundary: page 1
    bm.rollback(1, 4)
    r = bm.reserve(1, 9)  # positions 4..12 span pages 1, 2, 3
    assert list(r.slots) == list(range(4, 13))
    assert r.slots.dtype == np.int64 and r.copies.shape == (0, 4)
    assert bm.info(1).reserved == 9 and bm.info(1).num_pages == 4
    bm.commit(1, 2)
    assert (bm.info(1).committed, bm.info(1).reserved, bm.num_used_pages) == (6, 0, 2)


def test_rollback_into_a_block_and_to_zero():
    bm = make()
    bm.add_sequence(5)
    grow(bm, 5, 10)
    bm.rollback(5, 6)
    assert bm.info(5).num_pages == 2 and bm.num_used_pages == 2
    bm.rollback(5, 0)
    assert bm.num_free_pages == 8 and 5 in bm


def test_fork_shares_pages_and_copies_on_write():
    bm = make()
    bm.add_sequence(1)
    grow(bm, 1, 6)
    bm.fork(1, 2)
    assert bm.page_refcount(0) == 2 and bm.page_refcount(1) == 2
    r = bm.reserve(2, 1)
    assert r.copies.shape == (1, 4)
    model, src, dst, n = r.copies[0]
    assert (model, src, n) == (0, 1, 2)
    assert r.slots[0] == dst * 4 + 2
    assert list(bm.pages(1)) == [0, 1] and list(bm.pages(2)) == [0, dst]
    bm.check_invariants()
    bm.free_sequence(1)
    bm.free_sequence(2)
    assert bm.num_free_pages == 8


def test_errors_map_to_specific_exceptions():
    bm = make(num_pages=2)
    with pytest.raises(errors.UnknownSequenceError, match="unknown sequence 9"):
        bm.reserve(9, 1)
    with pytest.raises(KeyError):
        bm.free_sequence(9)
    bm.add_sequence(1)
    with pytest.raises(errors.SequenceExistsError):
        bm.add_sequence(1)
    with pytest.raises(errors.InvalidArgumentError, match="n must be >= 0"):
        bm.reserve(1, -1)
    bm.reserve(1, 2)
    with pytest.raises(errors.FailedPreconditionError, match="commit or roll back first"):
        bm.reserve(1, 1)
    with pytest.raises(errors.FailedPreconditionError, match="accepts 3 but only 2"):
        bm.commit(1, 3)
    bm.commit(1, 2)
    with pytest.raises(errors.OutOfRangeError, match="past the committed length 2"):
        bm.rollback(1, 3)
    with pytest.raises(errors.InvalidArgumentError, match="unknown model 'draft'"):
        bm.reserve(1, 1, model="draft")
    with pytest.raises(errors.InvalidArgumentError, match="out of range"):
        bm.reserve(1, 1, model=3)


def test_out_of_pages_is_recoverable_and_changes_nothing():
    bm = make(num_pages=2)
    bm.add_sequence(1)
    bm.add_sequence(2)
    grow(bm, 1, 8)
    with pytest.raises(errors.OutOfPagesError, match="needs 1 page"):
        bm.reserve(2, 1)
    assert bm.info(2).reserved == 0 and bm.num_free_pages == 0
    bm.free_sequence(1)  # preempt
    assert len(bm.reserve(2, 1).slots) == 1


def test_target_and_draft_share_the_pool_and_admission_counts_both():
    bm = make(num_pages=4, draft_bytes=4)  # target 4, draft 6 tokens per page
    assert bm.can_admit([8, 6])  # 2 + 1 pages
    assert bm.can_admit([16, 0])  # 4 + 0 pages
    assert not bm.can_admit([9, 7])  # 3 + 2 pages > 4
    assert bm.can_admit([8, 6], headroom_pages=1)
    assert not bm.can_admit([8, 6], headroom_pages=2)
    bm.add_sequence(1)
    grow(bm, 1, 6, model="draft")  # the draft takes one page of the shared pool
    assert bm.num_free_pages == 3 and not bm.can_admit([16, 0])
    with pytest.raises(errors.InvalidArgumentError):
        bm.can_admit([1, 1, 1])


def test_batch_reserve_and_commit():
    bm = make()
    for s in (10, 11, 12):
        bm.add_sequence(s)
    r = bm.reserve_batch(np.array([10, 11, 12]), [2, 0, 5])
    assert len(r.slots) == 7
    assert list(r.slots[:2]) == list(bm.slots(10, 0, 2))
    assert list(r.slots[2:]) == list(bm.slots(12, 0, 5))
    with pytest.raises(errors.InvalidArgumentError, match="more than once"):
        bm.commit_batch([10, 10], [1, 1])
    bm.commit_batch([10, 11, 12], [1, 0, 5])
    assert [bm.info(s).committed for s in (10, 11, 12)] == [1, 0, 5]
    with pytest.raises(errors.OutOfPagesError):
        bm.reserve_batch([10, 11], [20, 20])
    assert bm.info(10).reserved == 0  # all or nothing
    with pytest.raises(ValueError, match="one-dimensional"):
        bm.reserve_batch([[10]], [[1]])


def test_exports_are_zero_copy_and_outlive_the_manager():
    bm = make()
    for s in (1, 2, 3):
        bm.add_sequence(s)
    grow(bm, 1, 5)
    grow(bm, 2, 4)
    bm.reserve(1, 4)
    indptr, indices, last = bm.block_table_csr([1, 2, 3])
    assert indptr.tolist() == [0, 3, 4, 4]
    assert indices.tolist() == [0, 1, 3, 2]
    assert last.tolist() == [1, 4, 0]
    table = bm.block_table_padded([1, 2, 3], pad=-1)
    assert table.shape == (3, 3) and table.dtype == np.int32
    assert table.tolist() == [[0, 1, 3], [2, -1, -1], [-1, -1, -1]]
    assert bm.block_table_padded([2], width=5).tolist() == [[2, 0, 0, 0, 0]]
    with pytest.raises(errors.InvalidArgumentError, match="width 2"):
        bm.block_table_padded([1, 2], width=2)
    out = np.full((4, 5), 7, dtype=np.int64)  # a staging buffer with more rows than sequences
    bm.block_table_into([2, 1], out, pad=-1)
    assert out.tolist() == [[2, -1, -1, -1, -1], [0, 1, 3, -1, -1], [-1] * 5, [-1] * 5]
    bm.block_table_into([], out, pad=-2)
    assert out.tolist() == [[-2] * 5] * 4
    with pytest.raises(errors.InvalidArgumentError, match="width 2"):
        bm.block_table_into([1], np.zeros((1, 2), dtype=np.int64))
    with pytest.raises(errors.InvalidArgumentError, match="3 sequences but out has 2 rows"):
        bm.block_table_into([1, 2, 3], np.zeros((2, 5), dtype=np.int64))
    with pytest.raises(errors.InvalidArgumentError, match="2-D"):
        bm.block_table_into([1], np.zeros(5, dtype=np.int64))
    for wrong in (np.zeros((4, 5), dtype=np.int32), np.zeros((5, 4), dtype=np.int64).T):  # never a copy
        with pytest.raises(TypeError):
            bm.block_table_into([1], wrong)
    assert bm.kv_lens([1, 2, 3]).tolist() == [9, 4, 0]
    for arr in (indptr, indices, last, table):
        assert not arr.flags["OWNDATA"] and arr.base is not None  # memory owned by C++
    del bm
    gc.collect()
    assert table.tolist() == [[0, 1, 3], [2, -1, -1], [-1, -1, -1]]  # still valid


def test_kv_bytes_per_token_helper():
    assert specd.kv_bytes_per_token(28, 2, 128, 2) == 28672  # Qwen2.5-Coder-1.5B bf16
    with pytest.raises(ValueError, match="head_dim"):
        specd.kv_bytes_per_token(28, 2, 0, 2)
