"""Custom ops of the KV-cache kernels: ``specd::kv_write``, ``specd::kv_compact`` and
``specd::slot_mapping`` (rules: cpp/include/specd/kv_write.h, kv_compact.h,
kv_slot_mapping.h; layout: kv_layout.h).

Caches are one layer's K and V views of the page pool, ``[num_pages, block_size, kv_heads,
head_dim]`` (pages may be strided, as in :class:`~specd.kv_cache.KVCachePool`), or for
``kv_compact`` every layer at once, ``[num_layers, num_pages, ...]`` (see :func:`stacked_kv`).
They are written in place on both devices, never through a converted copy.
"""

from typing import Sequence

import torch

from specd import _core
from specd.models.attention import LayerKV
from specd.ops._checks import (KERNEL_DTYPES, cache_layout, common_device, fail, index, launch,
                               no_kernel_for_device, register_kernels, rows)

__all__ = ["kv_write", "kv_compact", "slot_mapping", "stacked_kv"]


@torch.library.custom_op("specd::kv_write", mutates_args=("k_cache", "v_cache"))
def kv_write(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Stores the new tokens' K and V rows in the paged caches at their slots (kv_write.h).

    k_cache, v_cache: ``[num_pages, block_size, kv_heads, head_dim]`` float32/float16/bfloat16,
        updated in place.
    k, v: ``[num_tokens, kv_heads, head_dim]`` of the caches' dtype (rows contiguous).
    slot_mapping: int64 ``[num_tokens]``; -1 (or a slot past the cache) writes nothing.
    Slots of one call must be distinct.
    """
    no_kernel_for_device("kv_write", k_cache, v_cache, k, v, slot_mapping)


def _kv_write(k_cache, v_cache, k, v, slot_mapping) -> None:
    op = "kv_write"
    device = common_device(op, k_cache=k_cache, v_cache=v_cache, k=k, v=v, slot_mapping=slot_mapping)
    layout, _, _ = cache_layout(op, k_cache, v_cache)
    tokens = slot_mapping.shape[0] if slot_mapping.dim() == 1 else -1
    slots = index(op, "slot_mapping", slot_mapping, torch.int64, (tokens,))
    inner = (layout.kv_heads, layout.head_dim)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != k_cache.dtype:
            fail(op, f"{name} must have the caches' dtype {k_cache.dtype} (cast first), got {t.dtype}")
    k, k_stride = rows(op, "k", k, inner)
    v, v_stride = rows(op, "v", v, inner)
    if k.shape[0] != tokens or v.shape[0] != tokens:
        fail(op, f"k and v must have slot_mapping's {tokens} tokens, got {k.shape[0]} and {v.shape[0]}")
    if tokens == 0:
        return
    launch(device, _core.kv_write_cpu_ptr, "kv_write_cuda", k_cache.data_ptr(), v_cache.data_ptr(), layout,
           k.data_ptr(), v.data_ptr(), k_stride, v_stride, slots.data_ptr(), tokens,
           KERNEL_DTYPES[k_cache.dtype])


@kv_write.register_fake
def _(k_cache, v_cache, k, v, slot_mapping) -> None:
    return None


@torch.library.custom_op("specd::kv_compact", mutates_args=("k_cache", "v_cache"))
def kv_compact(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
               tree_start: torch.Tensor, path: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """Moves each request's accepted tree path next to its history, in every layer
    (kv_compact.h): for d = 1..num_accepted[r], position tree_start[r] + path[r, d] is copied to
    tree_start[r] + d.

    k_cache, v_cache: ``[num_pages, block_size, kv_heads, head_dim]`` or ``[num_layers,
        num_pages, ...]`` (:func:`stacked_kv`), updated in place.
    block_table: int32 ``[num_seqs, width]`` page ids; tree_start: int32 ``[num_seqs]``;
    path: int32 ``[num_seqs, path_width]`` accepted nodes, root first (verify's padded
    layout); num_accepted: int32 ``[num_seqs]``.
    """
    no_kernel_for_device("kv_compact", k_cache, v_cache, block_table)


def _kv_compact(k_cache, v_cache, block_table, tree_start, path, num_accepted) -> None:
    op = "kv_compact"
    device = common_device(op, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                           tree_start=tree_start, path=path, num_accepted=num_accepted)
    layout, layers, layer_stride = cache_layout(op, k_cache, v_cache, ndims=(4, 5))
    seqs = block_table.shape[0] if block_table.dim() == 2 else -1
    table = index(op, "block_table", block_table, torch.int32, (seqs, -1))
    start = index(op, "tree_start", tree_start, torch.int32, (seqs,))
    path = index(op, "path", path, torch.int32, (seqs, -1))
    accepted = index(op, "num_accepted", num_accepted, torch.int32, (seqs,))
    if seqs == 0 or layers == 0 or path.shape[1] == 0:
        return
    launch(device, _core.kv_compact_cpu_ptr, "kv_compact_cuda", k_cache.data_ptr(), v_cache.data_ptr(), layout,
           layers, layer_stride, table.data_ptr(), seqs, table.shape[1], table.shape[1], start.data_ptr(),
           path.data_ptr(), accepted.data_ptr(), path.shape[1], KERNEL_DTYPES[k_cache.dtype])


@kv_compact.register_fake
def _(k_cache, v_cache, block_table, tree_start, path, num_accepted) -> None:
    return None


@torch.library.custom_op("specd::slot_mapping", mutates_args=())
def slot_mapping(block_table: torch.Tensor, seq_index: torch.Tensor, positions: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """KV slot of each token, ``block_table[s, p // bs] * bs + p % bs`` or -1
    (kv_slot_mapping.h).

    block_table: int32 ``[num_seqs, width]``; seq_index, positions: int32 ``[num_tokens]``
    (seq_index < 0: padding). Returns int64 ``[num_tokens]`` on the inputs' device.
    """
    no_kernel_for_device("slot_mapping", block_table, seq_index, positions)


def _slot_mapping(block_table, seq_index, positions, block_size) -> torch.Tensor:
    op = "slot_mapping"
    device = common_device(op, block_table=block_table, seq_index=seq_index, positions=positions)
    table = index(op, "block_table", block_table, torch.int32, (-1, -1))
    tokens = seq_index.shape[0] if seq_index.dim() == 1 else -1
    seqs = index(op, "seq_index", seq_index, torch.int32, (tokens,))
    pos = index(op, "positions", positions, torch.int32, (tokens,))
    if block_size < 1:
        fail(op, f"block_size must be >= 1, got {block_size}")
    if device.type == "cpu":
        return torch.from_numpy(_core.slot_mapping_cpu(table.numpy(), seqs.numpy(), pos.numpy(), block_size))
    out = torch.empty(tokens, dtype=torch.int64, device=device)
    if tokens:
        launch(device, None, "slot_mapping_cuda", table.data_ptr(), table.shape[0], table.shape[1],
               table.shape[1], seqs.data_ptr(), pos.data_ptr(), out.data_ptr(), tokens, block_size)
    return out


@slot_mapping.register_fake
def _(block_table, seq_index, positions, block_size):
    return seq_index.new_empty(seq_index.shape, dtype=torch.int64)


def stacked_kv(layers: Sequence[LayerKV]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's K (and V) cache of one model as one ``[num_layers, num_pages, block_size,
    kv_heads, head_dim]`` view of the pool (no copy), for one ``kv_compact`` over all layers.
    The pool packs layers at a constant distance; anything else is refused."""
    if not layers:
        fail("kv_compact", "stacked_kv needs at least one layer")
    k0, v0 = layers[0].k, layers[0].v
    step = (layers[1].k.data_ptr() - k0.data_ptr()) // k0.element_size() if len(layers) > 1 else k0.numel()
    if step <= 0:
        fail("kv_compact", "stacked_kv needs layers at increasing addresses")
    for i, layer in enumerate(layers):
        for name, t, base in (("k", layer.k, k0), ("v", layer.v, v0)):
            if (t.shape != base.shape or t.stride() != base.stride() or t.dtype != base.dtype
                    or t.data_ptr() - base.data_ptr() != i * step * base.element_size()):
                fail("kv_compact", f"layer {i}'s {name} cache is not at a constant distance from layer 0's")
    shape, strides = (len(layers), *k0.shape), (step, *k0.stride())
    return (k0.as_strided(shape, strides, k0.storage_offset()),
            v0.as_strided(shape, strides, v0.storage_offset()))


register_kernels(kv_write, _kv_write)
register_kernels(kv_compact, _kv_compact)
register_kernels(slot_mapping, _slot_mapping)
