"""An attention backend on specd's custom ops (specd.ops: ``kv_write`` + ``tree_attention``)
whose metadata lives entirely in device tensors, so a forward that uses it has no host-side
value in it and can be captured in a CUDA graph (the draft decode step, engine/draft_graph.py;
the target verify step, engine/target_graph.py).

Compared with :class:`~specd.models.attention.TorchPagedAttention` (metadata partly host
lists, per-sequence SDPA): every sequence is causal (``tree_mask`` None: each new token sees
the history and the new tokens before it) or follows the int64 tree-mask rows of
``tree_mask`` (tree_attention.h), no sliding window, and the KV extent of each
sequence is ``kv_lens`` read through int32 block tables. Slots of -1 are skipped by the
kernel, so padding rows cost nothing and write nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from specd.errors import InvalidArgumentError
from specd.models.attention import LayerKV
from specd.models.kernel_choice import grouped_for, kernels_of
from specd.ops import host_call


@dataclass
class DeviceAttentionMetadata:
    """A varlen batch described by device tensors only (see tree_attention.h)."""

    positions: torch.Tensor     # int64 [T] logical (RoPE) position of each new token
    slot_mapping: torch.Tensor  # int64 [T] slot of each new token's K/V (-1: do not write)
    block_tables: torch.Tensor  # int32 [B, W] page ids (-1 padded)
    query_start: torch.Tensor   # int32 [B + 1] CSR offsets of each sequence's new tokens
    kv_lens: torch.Tensor       # int32 [B] KV extent attended (history + new tokens)
    tree_mask: Optional[torch.Tensor] = None  # int64 [T, mask_words] ancestor bits; None: causal
    tree_lens: Optional[torch.Tensor] = None  # int32 [B] tree nodes per sequence (>= its queries); None: the queries


def kernel_attention_for(model) -> "KernelAttention":
    """The KernelAttention a model's kernel-attention forwards use: its KernelChoice's
    ``grouped_attention`` (models/kernel_choice.py; other model objects: the default "auto")."""
    return KernelAttention(grouped=kernels_of(model).grouped_attention)


class KernelAttention:
    """Attention through ``torch.ops.specd.kv_write`` and ``torch.ops.specd.tree_attention``
    (causal, or ``meta.tree_mask``). On CPU the op is the float32 reference; on CUDA the
    kernel (validated on an H100: docs/benchmarks.md). ``grouped``: on CUDA, True takes the
    split, head-grouped kernel (``specd.ops.tree_attention``), False the per-head kernel, and
    "auto" (default) chooses by the forward's query tokens and sequences
    (``kernel_choice.grouped_for``: both are shapes, so a CUDA graph captures one choice per
    bucket)."""

    def __init__(self, scale: Optional[float] = None, grouped: Union[bool, str] = "auto"):
        import specd.ops  # noqa: F401  (registers torch.ops.specd)

        self.scale = scale
        self.grouped = grouped

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerKV,
                meta: DeviceAttentionMetadata, sliding_window: Optional[int]) -> torch.Tensor:
        """q ``[T, H, D]``, k/v ``[T, Hkv, D]`` of the new tokens -> output ``[T, H, D]``."""
        if sliding_window is not None:
            raise InvalidArgumentError("KernelAttention has no sliding window; use TorchPagedAttention")
        host_call(torch.ops.specd.kv_write)(cache.k, cache.v, k.to(cache.k.dtype), v.to(cache.v.dtype),
                                            meta.slot_mapping)
        return self.attend(q, cache, meta)

    def attend(self, q: torch.Tensor, cache: LayerKV, meta: DeviceAttentionMetadata) -> torch.Tensor:
        """The attention of q ``[T, H, D]`` over caches that already hold the new tokens' K/V
        (written by ``forward`` or by the fused ``rope_kv_write``) -> ``[T, H, D]``."""
        return host_call(torch.ops.specd.tree_attention)(
            q, cache.k, cache.v, meta.block_tables, meta.query_start, meta.kv_lens, meta.tree_mask, self.scale,
            grouped_for(self.grouped, q.shape[0], meta.query_start.shape[0] - 1), meta.tree_lens)
