"""What the graph runners (draft_graph.py, target_graph.py) share: the packed int64 staging of
a run's inputs, uploaded to the device in ONE copy, and the capture of a CUDA graph.

PackedStaging lays named int64 fields end to end in one host buffer (pinned on CUDA) and one
device buffer of the same layout; ``fields`` are numpy views of the host side (filled by the
runner), ``device`` the matching views of the device side (read by the captured work).
``begin()`` waits until the previous upload has left the staging; ``upload()`` copies the
whole buffer host -> device without blocking. On CPU both sides are the same tensor.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import torch

from specd.errors import InvalidArgumentError


class PackedStaging:
    def __init__(self, shapes: Mapping[str, tuple], device: torch.device):
        on_device = device.type != "cpu"
        total = sum(int(np.prod(s)) for s in shapes.values())
        self.host = torch.zeros(total, dtype=torch.int64, pin_memory=on_device)
        self.packed = torch.zeros_like(self.host, device=device) if on_device else self.host
        self.uploaded = torch.cuda.Event() if on_device else None  # the host staging may be rewritten
        host_np = self.host.numpy()
        self.raw = memoryview(host_np).cast("B")  # the staging's bytes (for struct.pack_into)
        self.fields: dict[str, np.ndarray] = {}   # numpy views of the staging, per field
        self.device: dict[str, torch.Tensor] = {}  # device views of the packed copy, per field
        self.byte_offset: dict[str, int] = {}     # where each field starts in ``raw``
        offset = 0
        for name, shape in shapes.items():
            size = int(np.prod(shape))
            self.fields[name] = host_np[offset:offset + size].reshape(shape)
            self.device[name] = self.packed[offset:offset + size].view(shape)
            self.byte_offset[name] = 8 * offset
            offset += size

    def begin(self) -> None:
        """Before rewriting the staging: the previous run's copy has left it."""
        if self.uploaded is not None:
            self.uploaded.synchronize()

    def upload(self) -> None:
        """The whole staging to the device, on the current stream, without blocking."""
        if self.packed is not self.host:
            self.packed.copy_(self.host, non_blocking=True)
            self.uploaded.record()


def wants_capture(capture: Optional[bool], device: torch.device, buckets: Sequence[int], what: str) -> bool:
    """Whether a runner captures CUDA graphs: ``capture`` (None: on CUDA devices); capture
    needs a CUDA model and batch buckets (``what`` names the model in the error)."""
    wanted = capture if capture is not None else device.type == "cuda"
    if wanted and (device.type != "cuda" or not buckets):
        raise InvalidArgumentError(f"CUDA graph capture needs a CUDA {what} and batch buckets")
    return wanted


def capture_graph(body: Callable[[], object], device: torch.device,
                  pool: Optional[tuple]) -> tuple[torch.cuda.CUDAGraph, tuple]:
    """``body`` run once on a side stream (lazy initialisations stay out of the capture), then
    captured into a CUDA graph sharing the memory ``pool`` (None: a new one). Returns the graph
    and the pool to share with the next capture."""
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        body()
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        body()
    return graph, pool if pool is not None else graph.pool()
