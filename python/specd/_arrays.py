"""Converting user inputs (numpy arrays, torch tensors, lists) to what the C++ core takes."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from specd.errors import InvalidArgumentError


def is_torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def float32_matrix(x: Any, name: str) -> np.ndarray:
    """A C-contiguous float32 ``[rows, cols]`` numpy array from a 1-D/2-D array or tensor."""
    if is_torch_tensor(x):
        x = x.detach().to("cpu").float().numpy()
    arr = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise InvalidArgumentError(f"{name} must be 1-D or 2-D, got shape {arr.shape}")
    return arr


def like_input(result: np.ndarray, original: Any) -> Any:
    """Returns ``result`` as a torch tensor when the input was one (on the input's device)."""
    if is_torch_tensor(original):
        import torch

        return torch.from_numpy(result).to(original.device)
    return result
