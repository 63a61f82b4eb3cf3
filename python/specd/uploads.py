"""Host -> device copies that do not make the host wait for the GPU.

A ``.to(device)`` from pageable memory is a blocking copy: the host waits for everything
already queued on the stream. The engine uploads per-step inputs while the GPU may still be
running earlier work, so it copies from pinned memory without blocking instead (torch's
pinned-memory cache keeps a buffer until its copy is done). On the CPU nothing is copied.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: on a GPU copied from pinned memory without blocking."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def upload_packed(device: torch.device, arrays: Sequence[np.ndarray],
                  dtype: torch.dtype = torch.int64) -> list[torch.Tensor]:
    """Integer arrays to ``device`` in ONE copy: laid end to end in one host buffer of
    ``dtype`` (pinned on a GPU), returned as views of the device copy, each shaped as its
    array. On the CPU the views are of the host buffer. Where a ``.to(device)`` per array
    made one blocking copy each, this makes one that does not block."""
    sizes = [int(np.size(a)) for a in arrays]
    host = torch.empty(sum(sizes), dtype=dtype, pin_memory=device.type == "cuda")
    flat = host.numpy()
    at = 0
    for a, n in zip(arrays, sizes):
        flat[at:at + n] = np.asarray(a).ravel()
        at += n
    packed = host if device.type == "cpu" else host.to(device, non_blocking=True)
    views, at = [], 0
    for a, n in zip(arrays, sizes):
        views.append(packed[at:at + n].view(np.shape(a)))
        at += n
    return views
