"""specd: a speculative-decoding runtime (C++/CUDA core, thin Python layer).

Today the package offers the KV-cache layer: :class:`BlockManager` (paged KV allocator with
lookahead slots, commit/rollback and copy-on-write fork, for target and draft models in one
page pool) and :func:`slot_mapping`. See docs/api.md.
"""

from __future__ import annotations

from specd import errors
from specd._core import __version__
from specd.errors import (
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    OutOfPagesError,
    OutOfRangeError,
    SequenceExistsError,
    SpecdError,
    UnknownSequenceError,
)
from specd.kv import BlockManager, Reservation, SeqKvInfo, kv_bytes_per_token, slot_mapping


def built_with_cuda() -> bool:
    """True when this build of specd contains the CUDA kernels."""
    from specd import _core

    return bool(_core.built_with_cuda)


def cuda_available() -> bool:
    """True when the CUDA kernels are built in and a CUDA device is usable now."""
    from specd import _core

    return bool(_core.built_with_cuda) and _core.cuda_device_count() > 0


__all__ = [
    "__version__",
    "errors",
    "BlockManager",
    "Reservation",
    "SeqKvInfo",
    "kv_bytes_per_token",
    "slot_mapping",
    "built_with_cuda",
    "cuda_available",
    *errors.__all__,
]
