"""The KV page pool: one byte buffer of ``num_pages`` pages shared by the target and draft
models, with the C++ :class:`~specd.BlockManager` deciding which page holds what.

Layout: page ``p`` is bytes ``[p * page_bytes, (p + 1) * page_bytes)``. Model m sees each
page as ``[num_layers, 2 (k, v), block_size_m, kv_heads, head_dim]`` of its dtype, packed
from the page's start; the rest of the page is unused when model m's K/V is smaller. So
slot ``s`` of model m is token ``s % block_size_m`` of page ``s // block_size_m``, exactly
the slot numbering of the block manager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from specd._core import BlockManager
from specd.errors import InvalidArgumentError
from specd.models.attention import LayerKV
from specd.models.config import ModelConfig
from specd.uploads import upload_packed

_DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


@dataclass(frozen=True)
class KVModel:
    name: str             # "target" | "draft"
    config: ModelConfig
    dtype: torch.dtype    # of its K/V (= the model's dtype)

    @property
    def bytes_per_token(self) -> int:
        return self.config.kv_bytes_per_token(_DTYPE_BYTES[self.dtype])


class KVCachePool:
    """Page storage and per-layer K/V views for each model, plus the block manager."""

    def __init__(self, models: list[KVModel], num_pages: int, target_block_size: int = 16,
                 device: str | torch.device = "cpu", prefix_caching: bool = False):
        if not models:
            raise InvalidArgumentError("KVCachePool needs at least one model")
        for m in models:
            if m.dtype not in _DTYPE_BYTES:
                raise InvalidArgumentError(f"model '{m.name}': unsupported KV dtype {m.dtype}")
        if target_block_size < 1 or num_pages < 1:
            raise InvalidArgumentError(f"need target_block_size >= 1 and num_pages >= 1, got "
                                       f"{target_block_size} and {num_pages}")
        self.models = models
        self.page_bytes = target_block_size * models[0].bytes_per_token
        self.blocks = BlockManager(page_bytes=self.page_bytes, num_pages=num_pages,
                                   models=[(m.name, m.bytes_per_token) for m in models],
                                   prefix_caching=prefix_caching)
        self.storage = torch.zeros(num_pages * self.page_bytes, dtype=torch.uint8, device=device)
        self._layers = [self._views(i, m) for i, m in enumerate(models)]
        self._stacked: list = [None] * len(models)  # per model: (k, v) of all layers (stacked_kv), on first use

    @staticmethod
    def pages_for_memory(memory_bytes: int, target: KVModel, target_block_size: int = 16) -> int:
        """How many pages fit in ``memory_bytes``."""
        return max(1, memory_bytes // (target_block_size * target.bytes_per_token))

    def _views(self, index: int, m: KVModel) -> list[LayerKV]:
        c, bs = m.config, self.blocks.block_size(index)
        per_page = c.num_hidden_layers * 2 * bs * c.num_key_value_heads * c.head_dim
        elem = _DTYPE_BYTES[m.dtype]
        pages = self.storage.view(-1, self.page_bytes)[:, : per_page * elem].view(m.dtype)
        shaped = pages.unflatten(1, (c.num_hidden_layers, 2, bs, c.num_key_value_heads, c.head_dim))
        return [LayerKV(k=shaped[:, layer, 0], v=shaped[:, layer, 1]) for layer in range(c.num_hidden_layers)]

    def layers(self, model: int) -> list[LayerKV]:
        """K/V views of every layer of model ``model``: ``[num_pages, block_size, kv_heads, head_dim]``."""
        return self._layers[model]

    def block_size(self, model: int) -> int:
        return self.blocks.block_size(model)

    def copy_slots(self, model: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copies the K/V of token slots ``src`` to ``dst`` (int64 ``[n]``) in every layer:
        accepted tree paths moved into place, or copy-on-write pages."""
        if src.numel() == 0:
            return
        bs = self.block_size(model)
        src, dst = src.to(self.storage.device), dst.to(self.storage.device)
        sp, so = torch.div(src, bs, rounding_mode="floor"), src % bs
        dp, do = torch.div(dst, bs, rounding_mode="floor"), dst % bs
        for layer in self._layers[model]:
            layer.k[dp, do] = layer.k[sp, so]
            layer.v[dp, do] = layer.v[sp, so]

    def compact(self, model: int, seqs: Sequence[int], tree_start: Sequence[int],
                paths: Sequence[np.ndarray]) -> None:
        """Moves accepted tree paths next to their sequences' histories, in every layer of
        model ``model``, with ONE ``kv_compact`` over all the sequences and layers
        (cpp/include/specd/kv_compact.h): for sequence i, the K/V at position ``tree_start[i] +
        paths[i][d]`` is copied to ``tree_start[i] + d``, for d = 1 .. len(paths[i]) - 1, in
        increasing d. ``paths[i]`` starts with 0 and strictly increases (a root-to-node path in
        node order). Call it before the sequences commit: positions resolve through their
        block tables, whose reserved pages a commit may free."""
        if not seqs:
            return
        from specd.ops import host_call, kv_compact, stacked_kv

        if not len(seqs) == len(tree_start) == len(paths):
            raise InvalidArgumentError(f"compact: {len(seqs)} sequences, {len(tree_start)} tree starts and "
                                       f"{len(paths)} paths")
        n = len(seqs)
        lengths = np.fromiter((len(p) for p in paths), dtype=np.int64, count=n)
        width = max(int(lengths.max()), 1)
        rows = np.full((n, width), -1, dtype=np.int32)  # padding (kv_compact reads entries 0..num_accepted only)
        for i, p in enumerate(paths):
            rows[i, :len(p)] = p
        steps = np.diff(rows, axis=1) <= 0  # [n, width - 1]: a pair not increasing...
        inside = np.arange(width - 1) < (lengths - 1)[:, None]  # ...within the path
        bad = (lengths == 0) | (rows[:, 0] != 0) | np.any(steps & inside, axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InvalidArgumentError(f"compact: sequence {seqs[i]}'s path {list(paths[i])} does not start at 0 "
                                       "and strictly increase")
        table = self.blocks.block_table_padded(np.asarray(seqs, dtype=np.int64), model=model, pad=-1)
        table, start, accepted, path = upload_packed(self.storage.device, [table, np.asarray(tree_start),
                                                                           lengths - 1, rows], torch.int32)
        if self._stacked[model] is None:
            self._stacked[model] = stacked_kv(self._layers[model])
        k, v = self._stacked[model]
        host_call(kv_compact)(k, v, table, start, path, accepted)

    def apply_copies(self, copies) -> None:
        """Performs a Reservation's copy-on-write page copies (rows of model, src, dst, n)."""
        for model, src_page, dst_page, n in copies.tolist():
            bs = self.block_size(model)
            src = torch.arange(src_page * bs, src_page * bs + n, dtype=torch.int64)
            self.copy_slots(model, src, src - src_page * bs + dst_page * bs)

