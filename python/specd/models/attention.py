"""Paged attention over a varlen batch with per-sequence token-tree masks.

A forward pass processes the *new* tokens of B sequences, flattened: sequence ``i`` owns
tokens ``[query_start[i], query_start[i+1])``. Each new token's K/V is first written into the
KV cache at ``slot_mapping``; then every new token attends to its sequence's whole KV
extent ``[0, kv_lens[i])`` read through the block table. That extent is the committed
history followed by the new tokens in the order they were written. Who may attend to whom
among the new tokens is given per sequence:

- ``masks[i] is None``: causal (prefill chunks, chains);
- otherwise a bool ``[q_len, t]`` with ``q_len <= t <= kv_len``: the mask covers the last
  ``t`` keys of the extent (a token tree; the new tokens are its last ``q_len`` nodes) and is
  ``True`` where new token j may attend to key ``kv_len - t + m`` (the tree's ancestor mask,
  with the prefix chunk causal before it). ``t == q_len`` is a tree fed whole; ``t > q_len``
  a tree grown a frontier at a time, whose earlier nodes' K/V is in the cache already (the
  draft tree loop, engine/draft_tree.py; tree_attention.h's ``tree_lens``).

All committed tokens are visible to every new token, except where a sliding window
hides them. The window is measured on *logical* positions (``key_positions``), because
tree nodes are written in node order while their logical positions are root position +
depth.

:class:`AttentionBackend` is the one interface a faster kernel (CUDA paged attention with
tree masks, issue 7) replaces. :class:`TorchPagedAttention` is the reference
implementation: gather the pages, then scaled dot-product attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import torch
import torch.nn.functional as F

from specd.errors import InvalidArgumentError


@dataclass
class AttentionMetadata:
    """What attention needs to know about a varlen batch (host-side lists are fine on CPU)."""

    query_start: list[int]          # [B + 1] CSR offsets of each sequence's new tokens
    kv_lens: list[int]              # [B] KV extent attended (history + new tokens)
    block_tables: torch.Tensor      # int64 [B, W] page ids (padded)
    slot_mapping: torch.Tensor      # int64 [T] slot of each new token's K/V (-1: do not write)
    positions: torch.Tensor         # int64 [T] logical (RoPE) position of each new token
    masks: list[Optional[torch.Tensor]]  # [B] None (causal) or bool [q_len, t], q_len <= t <= kv_len
    key_positions: Optional[list[Optional[torch.Tensor]]] = None  # [B] int64 [kv_len] for windows
    has_skipped_slots: bool = False  # some slot is -1 (decided on the host: no device sync)

    @property
    def num_seqs(self) -> int:
        return len(self.kv_lens)


@dataclass
class LayerKV:
    """One layer's K and V caches: views ``[num_pages, block_size, kv_heads, head_dim]``."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def block_size(self) -> int:
        return self.k.shape[1]


class AttentionBackend(Protocol):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerKV,
                meta: AttentionMetadata, sliding_window: Optional[int]) -> torch.Tensor:
        """q ``[T, H, D]``, k/v ``[T, Hkv, D]`` of the new tokens -> output ``[T, H, D]``."""


def write_kv(cache: LayerKV, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor,
             has_skipped_slots: bool = False) -> None:
    """Stores k/v ``[T, Hkv, D]`` at ``slots`` ``[T]`` (slot = page * block_size + offset);
    slots of -1 are skipped when ``has_skipped_slots`` (known to the caller on the host, so
    no device-to-host synchronisation happens here)."""
    if has_skipped_slots:
        keep = slots >= 0
        k, v, slots = k[keep], v[keep], slots[keep]
    pages = torch.div(slots, cache.block_size, rounding_mode="floor")
    offsets = slots - pages * cache.block_size
    cache.k[pages, offsets] = k.to(cache.k.dtype)
    cache.v[pages, offsets] = v.to(cache.v.dtype)


def gather_kv(cache: LayerKV, block_table: torch.Tensor, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``kv_len`` tokens of one sequence: k, v ``[kv_len, Hkv, D]``."""
    num_blocks = -(-kv_len // cache.block_size)
    pages = block_table[:num_blocks]
    k = cache.k[pages].reshape(-1, *cache.k.shape[2:])[:kv_len]
    v = cache.v[pages].reshape(-1, *cache.v.shape[2:])[:kv_len]
    return k, v


def attention_mask(q_len: int, kv_len: int, mask: Optional[torch.Tensor],
                   query_positions: torch.Tensor, key_positions: Optional[torch.Tensor],
                   sliding_window: Optional[int], device: torch.device) -> Optional[torch.Tensor]:
    """bool ``[q_len, kv_len]`` (True = may attend), or None for plain causal attention with no
    history (which SDPA's ``is_causal`` handles). ``mask``: None (causal) or bool ``[q_len, t]``
    over the last ``t`` keys (AttentionMetadata.masks)."""
    if mask is not None and not (mask.dim() == 2 and mask.shape[0] == q_len and q_len <= mask.shape[1] <= kv_len):
        raise InvalidArgumentError(f"a mask of shape {tuple(mask.shape)} for {q_len} new tokens of a {kv_len}-key extent: "
                         f"want [{q_len}, t] with {q_len} <= t <= {kv_len}")
    history = kv_len - (mask.shape[1] if mask is not None else q_len)
    if mask is None and history == 0 and sliding_window is None:
        return None
    new = mask if mask is not None else torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()
    full = torch.cat([torch.ones(q_len, history, dtype=torch.bool, device=device), new.to(device)], dim=1)
    if sliding_window is not None:
        keys = key_positions if key_positions is not None else torch.arange(kv_len, device=device)
        full &= (query_positions[:, None] - keys[None, :]) < sliding_window
    return full


class TorchPagedAttention:
    """Reference backend: per sequence, gather its pages and run SDPA (GQA-aware)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerKV,
                meta: AttentionMetadata, sliding_window: Optional[int]) -> torch.Tensor:
        write_kv(cache, k, v, meta.slot_mapping, meta.has_skipped_slots)
        out = torch.empty_like(q)
        heads, kv_heads = q.shape[1], k.shape[1]
        for i in range(meta.num_seqs):
            start, end = meta.query_start[i], meta.query_start[i + 1]
            q_len, kv_len = end - start, meta.kv_lens[i]
            keys, values = gather_kv(cache, meta.block_tables[i], kv_len)
            mask = attention_mask(q_len, kv_len, meta.masks[i], meta.positions[start:end],
                                  meta.key_positions[i] if meta.key_positions else None,
                                  sliding_window, q.device)
            qi = q[start:end].transpose(0, 1)                   # [H, q_len, D]
            ki = keys.to(q.dtype).transpose(0, 1)               # [Hkv, kv_len, D]
            vi = values.to(q.dtype).transpose(0, 1)
            out[start:end] = F.scaled_dot_product_attention(
                qi, ki, vi, attn_mask=mask, is_causal=mask is None and q_len > 1,
                enable_gqa=heads != kv_heads).transpose(0, 1)
        return out
