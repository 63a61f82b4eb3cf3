"""Custom op of the paged tree-attention kernel: ``specd::tree_attention`` (rule:
cpp/include/specd/tree_attention.h).

The CPU implementation is the reference (float32 only, double accumulation); the CUDA kernel
takes float32/float16/bfloat16 and accumulates in float. No sliding windows, soft-capping or
ALiBi: models with those keep the torch path (models/attention.py).
"""

import functools
import math
from typing import Optional

import torch

from specd import _core
from specd.ops._checks import (KERNEL_DTYPES, cache_layout, common_device, expect, fail, index, launch,
                               no_kernel_for_device, register_kernels, rows)

__all__ = ["tree_attention"]


@torch.library.custom_op("specd::tree_attention", mutates_args=())
def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                   query_start: torch.Tensor, kv_lens: torch.Tensor, tree_mask: Optional[torch.Tensor] = None,
                   scale: Optional[float] = None, grouped: bool = False,
                   tree_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention of each request's new tokens over its paged KV (tree_attention.h).

    q: ``[num_tokens, q_heads, head_dim]`` of the caches' dtype (rows contiguous).
    k_cache, v_cache: ``[num_pages, block_size, kv_heads, head_dim]`` (the new tokens' K/V
        already written, e.g. by ``kv_write``).
    block_table: int32 ``[num_seqs, width]``; query_start: int32 ``[num_seqs + 1]`` (request r
        owns queries ``[query_start[r], query_start[r+1])``); kv_lens: int32 ``[num_seqs]``
        (history + new tokens).
    tree_mask: int64 ``[num_tokens, mask_words]`` (the bits of ``TokenTree.ancestor_mask``
        rows) or None for causal. scale: default ``1 / sqrt(head_dim)``.
    grouped: on CUDA, the split, head-grouped kernel (cuda/tree_attention_grouped.h: a block per
        query token, GQA group and KV split, partial states merged; its float32 workspace is
        allocated here) instead of the per-head kernel. Same rule and result up to float
        rounding; validated on an H100. Ignored on CPU (the reference).
    tree_lens: int32 ``[num_seqs]`` or None: each request's tree is its last ``tree_lens[r]`` KV
        positions (``q_len <= tree_lens[r] <= kv_lens[r]``), its queries the last of them, and
        the mask rows cover the whole tree (``mask_words * 64 >= tree_lens[r]``): a forward that
        feeds only a tree's newest nodes (engine/draft_tree_graph.py). None: the queries are
        the tree. Validated on an H100 (the kernels share the CPU reference's rule code).
    Returns ``[num_tokens, q_heads, head_dim]`` in q's dtype. CPU: float32 only.
    """
    no_kernel_for_device("tree_attention", q, k_cache, v_cache)


def _tree_attention(q, k_cache, v_cache, block_table, query_start, kv_lens, tree_mask=None, scale=None,
                    grouped=False, tree_lens=None):
    op = "tree_attention"
    device = common_device(op, q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                           query_start=query_start, kv_lens=kv_lens, tree_mask=tree_mask, tree_lens=tree_lens)
    layout, _, _ = cache_layout(op, k_cache, v_cache)
    if q.dtype != k_cache.dtype:
        fail(op, f"q must have the caches' dtype {k_cache.dtype}, got {q.dtype}")
    if device.type == "cpu" and q.dtype != torch.float32:
        fail(op, f"the CPU reference is float32 only, got {q.dtype} (the CUDA kernel takes 16-bit types)")
    if q.dim() != 3 or q.shape[2] != layout.head_dim:
        fail(op, f"q must be [num_tokens, q_heads, {layout.head_dim}], got {list(q.shape)}")
    q, q_stride = rows(op, "q", q, tuple(q.shape[1:]))
    tokens, heads = q.shape[0], q.shape[1]
    if heads % layout.kv_heads:
        fail(op, f"q_heads ({heads}) must be a multiple of the caches' kv_heads ({layout.kv_heads})")
    seqs = block_table.shape[0] if block_table.dim() == 2 else -1
    table = index(op, "block_table", block_table, torch.int32, (seqs, -1))
    starts = index(op, "query_start", query_start, torch.int32, (seqs + 1,))
    lens = index(op, "kv_lens", kv_lens, torch.int32, (seqs,))
    mask_ptr, mask_words = 0, 0
    if tree_mask is not None:
        expect(op, "tree_mask", tree_mask, torch.int64, 2)
        mask = index(op, "tree_mask", tree_mask, torch.int64, (tokens, -1))
        mask_ptr, mask_words = mask.data_ptr(), mask.shape[1]
    trees = index(op, "tree_lens", tree_lens, torch.int32, (seqs,)) if tree_lens is not None else None
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    if tokens == 0:
        return out
    scale = 1.0 / math.sqrt(layout.head_dim) if scale is None else float(scale)
    args = (q.data_ptr(), q_stride, k_cache.data_ptr(), v_cache.data_ptr(), layout, table.data_ptr(), table.shape[1],
            table.shape[1], starts.data_ptr(), lens.data_ptr(), mask_ptr, mask_words, out.data_ptr(),
            heads * layout.head_dim, seqs, tokens, heads, scale, KERNEL_DTYPES[q.dtype])
    options = {}  # the CUDA launcher's kernel choice (the per-head kernel by default)
    if grouped and device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        splits, floats = _core.tree_attention_grouped_plan(tokens, heads, layout.kv_heads, layout.head_dim, sms)
        # Stream-ordered: the caching allocator reuses the block only after this stream's kernels.
        workspace = torch.empty(floats, dtype=torch.float32, device=device) if floats else None
        options = dict(grouped=True, workspace_ptr=workspace.data_ptr() if floats else 0, workspace_floats=floats,
                       max_splits=splits)
    trees_ptr = trees.data_ptr() if trees is not None else 0
    launch(device, functools.partial(_core.tree_attention_cpu_ptr, tree_lens_ptr=trees_ptr), "tree_attention_cuda",
           *args, tree_lens_ptr=trees_ptr, **options)
    return out


@tree_attention.register_fake
def _(q, k_cache, v_cache, block_table, query_start, kv_lens, tree_mask=None, scale=None, grouped=False,
      tree_lens=None):
    return q.new_empty(q.shape)


register_kernels(tree_attention, _tree_attention)
