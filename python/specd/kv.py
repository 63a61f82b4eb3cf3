"""KV-cache layer: the paged block manager and the slot-mapping rule.

``BlockManager`` is the C++ allocator (``specd._core``); its rules are written in
``cpp/include/specd/block_manager.h`` and docs/api.md. ``slot_mapping`` computes, from padded
block tables, the KV slot each token of a forward pass writes; it runs the C++ reference for
numpy arrays and CPU tensors and the CUDA kernel for CUDA tensors.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from specd import _core
from specd._core import BlockManager, Reservation, SeqKvInfo
from specd.errors import InvalidArgumentError

__all__ = ["BlockManager", "Reservation", "SeqKvInfo", "kv_bytes_per_token", "slot_mapping"]


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of K and V one token occupies over all layers of a model.

    This is the ``kv_bytes_per_token`` a model is registered with in :class:`BlockManager`;
    e.g. Qwen2.5-Coder-1.5B in bfloat16: ``kv_bytes_per_token(28, 2, 128, 2) == 28672``.
    """
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("dtype_bytes", dtype_bytes)):
        if int(value) <= 0:
            raise InvalidArgumentError(f"{name} must be > 0, got {value}")
    return 2 * int(num_layers) * int(num_kv_heads) * int(head_dim) * int(dtype_bytes)


def _torch_tensor_type() -> Any:
    torch = sys.modules.get("torch")
    return torch.Tensor if torch is not None else None


def slot_mapping(block_table: Any, seq_index: Any, positions: Any, block_size: int, *,
                 strict: bool = False) -> Any:
    """KV slot of each token: ``block_table[s, p // bs] * bs + p % bs``, or -1.

    Args:
        block_table: int32 ``[num_seqs, width]`` page ids (``BlockManager.block_table_padded``).
        seq_index: int32 ``[num_tokens]`` row of ``block_table`` of each token; < 0 = padding.
        positions: int32 ``[num_tokens]`` position of each token in its sequence.
        block_size: tokens per block of the model (``BlockManager.block_size(model)``).
        strict: host inputs only: raise ``OutOfRangeError`` for a non-padding token the table
            does not cover, instead of giving it slot -1.

    Returns int64 ``[num_tokens]``: a numpy array for numpy input, a tensor on the inputs'
    device for torch input (CUDA tensors run the CUDA kernel on the current stream, no sync).
    """
    tensor_type = _torch_tensor_type()
    if tensor_type is not None and isinstance(block_table, tensor_type):
        return _slot_mapping_torch(block_table, seq_index, positions, int(block_size), strict)
    return _core.slot_mapping_cpu(np.asarray(block_table, dtype=np.int32),
                                  np.asarray(seq_index, dtype=np.int32),
                                  np.asarray(positions, dtype=np.int32),
                                  int(block_size), strict)


def _slot_mapping_torch(block_table: Any, seq_index: Any, positions: Any, block_size: int,
                        strict: bool) -> Any:
    import torch

    tensors = {"block_table": block_table, "seq_index": seq_index, "positions": positions}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"{name} must be a torch.Tensor like block_table")
        if t.device != block_table.device:
            raise InvalidArgumentError(
                f"{name} is on {t.device} but block_table is on {block_table.device}")
    if block_table.device.type == "cpu":
        out = _core.slot_mapping_cpu(block_table.to(torch.int32).contiguous().numpy(),
                                     seq_index.to(torch.int32).contiguous().numpy(),
                                     positions.to(torch.int32).contiguous().numpy(),
                                     block_size, strict)
        return torch.from_numpy(out)
    if block_table.device.type != "cuda":
        raise InvalidArgumentError(f"slot_mapping supports cpu and cuda tensors, not "
                                   f"{block_table.device.type}")
    if not hasattr(_core, "slot_mapping_cuda"):
        raise InvalidArgumentError("this specd build has no CUDA kernels (built without nvcc); "
                                   "pass CPU tensors or rebuild with SPECD_CUDA=ON")
    if block_table.dim() != 2 or seq_index.dim() != 1 or positions.shape != seq_index.shape:
        raise InvalidArgumentError(
            "expected block_table [num_seqs, width], seq_index and positions [num_tokens]; got "
            f"{tuple(block_table.shape)}, {tuple(seq_index.shape)}, {tuple(positions.shape)}")
    table = block_table.to(torch.int32).contiguous()
    seqs = seq_index.to(torch.int32).contiguous()
    pos = positions.to(torch.int32).contiguous()
    out = torch.empty(seqs.shape[0], dtype=torch.int64, device=table.device)
    stream = torch.cuda.current_stream(table.device).cuda_stream
    _core.slot_mapping_cuda(table.data_ptr(), table.shape[0], table.shape[1], table.shape[1],
                            seqs.data_ptr(), pos.data_ptr(), out.data_ptr(), seqs.shape[0],
                            block_size, stream)
    return out
