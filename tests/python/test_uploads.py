"""specd.uploads: integer arrays packed end to end and uploaded in one copy come back as views
of the right shapes, dtype and values (CPU; GPU twin skips without a device); to_device keeps
a tensor's values."""

import numpy as np
import pytest
import torch

from specd.uploads import to_device, upload_packed


def arrays():
    rng = np.random.default_rng(0)
    return [rng.integers(-5, 5, (3, 4)), np.arange(7, dtype=np.int32), np.zeros(0, dtype=np.int64),
            np.asarray([2**40, -1])]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_upload_packed_gives_each_array_back(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    got = upload_packed(torch.device(device), arrays())
    for a, g in zip(arrays(), got):
        assert g.dtype == torch.int64 and g.device.type == device and tuple(g.shape) == a.shape
        np.testing.assert_array_equal(g.cpu().numpy(), a)
    small = upload_packed(torch.device(device), arrays()[:2], torch.int32)
    assert all(g.dtype == torch.int32 for g in small)
    np.testing.assert_array_equal(small[0].cpu().numpy(), arrays()[0])
    t = torch.arange(5)
    assert torch.equal(to_device(t, torch.device(device)).cpu(), t)
