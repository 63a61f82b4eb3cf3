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
import torch

from specd._core import BlockManager
from specd.errors import InvalidArgumentError
from specd.models.attention import LayerKV
from specd.models.config import ModelConfig

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
                 device: str | torch.device = "cpu"):
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
                                   models=[(m.name, m.bytes_per_token) for m in models])
        self.storage = torch.zeros(num_pages * self.page_bytes, dtype=torch.uint8, device=device)
        self._layers = [self._views(i, m) for i, m in enumerate(models)]

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

    def apply_copies(self, copies) -> None:
        """Performs a Reservation's copy-on-write page copies (rows of model, src, dst, n)."""
        for model, src_page, dst_page, n in copies.tolist():
            bs = self.block_size(model)
            src = torch.arange(src_page * bs, src_page * bs + n, dtype=torch.int64)
            self.copy_slots(model, src, src - src_page * bs + dst_page * bs)

