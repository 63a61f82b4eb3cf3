"""specd.slot_mapping: numpy and torch (CPU) inputs against a direct numpy computation;
the CUDA kernel against the CPU reference when a GPU is present."""

import numpy as np
import pytest
import torch

import specd
from specd import errors


def expected(table, seqs, pos, bs):
    out = np.full(len(seqs), -1, dtype=np.int64)
    for t, (s, p) in enumerate(zip(seqs, pos)):
        if 0 <= s < table.shape[0] and p >= 0 and p // bs < table.shape[1]:
            page = table[s, p // bs]
            if page >= 0:
                out[t] = page * bs + p % bs
    return out


def random_case(rng, tokens=500):
    rows, width, bs = rng.integers(1, 20), rng.integers(1, 12), int(rng.integers(1, 17))
    table = rng.integers(-3, 1000, size=(rows, width)).astype(np.int32)
    seqs = rng.integers(-1, rows + 1, size=tokens).astype(np.int32)
    pos = rng.integers(-2, width * bs + 5, size=tokens).astype(np.int32)
    return table, seqs, pos, bs


def test_numpy_matches_direct_computation():
    rng = np.random.default_rng(0)
    for _ in range(30):
        table, seqs, pos, bs = random_case(rng)
        got = specd.slot_mapping(table, seqs, pos, bs)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, expected(table, seqs, pos, bs))


def test_torch_cpu_tensors_give_a_tensor():
    rng = np.random.default_rng(1)
    table, seqs, pos, bs = random_case(rng)
    got = specd.slot_mapping(torch.from_numpy(table), torch.from_numpy(seqs),
                             torch.from_numpy(pos).long(), bs)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), expected(table, seqs, pos, bs))


def test_strict_mode_and_bad_input():
    table = np.array([[5, 2]], dtype=np.int32)
    assert specd.slot_mapping(table, [0, -1], [7, 99], 4, strict=True).tolist() == [11, -1]
    with pytest.raises(errors.OutOfRangeError, match="token 1"):
        specd.slot_mapping(table, [0, 0], [7, 8], 4, strict=True)
    with pytest.raises(ValueError, match="block_size"):
        specd.slot_mapping(table, [0], [0], 0)
    with pytest.raises(ValueError, match="2-D"):
        specd.slot_mapping(np.zeros(3, np.int32), [0], [0], 4)
    with pytest.raises(ValueError, match="positions has 1"):
        specd.slot_mapping(table, [0, 0], [0], 4)
    with pytest.raises(ValueError, match="torch.Tensor"):
        specd.slot_mapping(torch.from_numpy(table), [0], [0], 4)


@pytest.mark.skipif(not specd.cuda_available(), reason="no CUDA device (or specd built without CUDA)")
def test_cuda_kernel_matches_cpu_reference():
    rng = np.random.default_rng(2)
    for _ in range(10):
        table, seqs, pos, bs = random_case(rng, tokens=int(rng.integers(0, 5000)))
        dev = [torch.from_numpy(a).cuda() for a in (table, seqs, pos)]
        got = specd.slot_mapping(*dev, bs)
        assert got.device.type == "cuda" and got.dtype == torch.int64
        np.testing.assert_array_equal(got.cpu().numpy(), specd.slot_mapping(table, seqs, pos, bs))
