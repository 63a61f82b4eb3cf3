"""The target's verify forward over fixed-shape buffers, graph-capturable per (bucket, q).

``run_target`` (model_runner.py) runs one varlen target forward over every item's new tokens:
prefill chunks, then each request's root and draft tree. A step with no prefill in it (every
item verifies: its root plus its chain or tree, nothing else) has a fixed shape once padded:

    q      query rows per request: the largest tree of the step (root + draft nodes); shorter
           trees get dummy rows (token 0, slot -1: no KV written, tree-mask row empty, so
           they see only the history and no real row sees them);
    B      requests, padded to a batch-size bucket (dummy requests: slots -1, no pages,
           nothing visible, zero attention output);
    T      = B * q tokens; request i owns rows [i q, (i + 1) q) (query_start = 0, q, 2q, ...).

:class:`TargetGraphRunner` copies a step's inputs (token ids, positions, slot mapping, the
rows the verifier needs logits for, int64 tree-mask words, kv_lens, block tables) into one
int64 buffer with ONE host->device copy from pinned staging, then runs the target forward
with :class:`~specd.models.kernel_attention.KernelAttention` (``kv_write`` + tree-masked
``tree_attention``, metadata in device tensors only). The LM head runs on the logits rows
only: row r of the output is item i's node j for the r-th (i, j) in item order, so the first
``sum(len(tree))`` rows are exactly what ``run_target`` returns. On CUDA the forward is
captured once per (bucket, q) in a ``torch.cuda.CUDAGraph`` and replayed; on CPU it runs
eagerly (used to test it against the plain path). Every graph writes its logits into one
shared buffer of ``max_tokens`` rows in the model's ``logits_dtype`` (the model's dtype on a
GPU; ``LlamaModel.forward(logits_out=...)``), instead of each graph holding its own
``[B q, vocab]`` output.

Real query j of request i (history c = its committed target length) gets kv_len = c + q:
the kernel's history is kv_len - q_len = c, new token m sits at position c + m, and the tree
mask row (the node's ancestor bits, ``TokenTree.ancestor_mask``) lets it see m only where m is
an ancestor or itself; padded positions c + size .. c + q - 1 are never visible (their bits
are 0, and past the reserved pages they have no slot at all).

Steps that do not fit (a prefill chunk in the batch, more requests than the last bucket, q
above ``max_query``, more than ``max_tokens`` padded rows, a block table wider than the
buffers) run the plain path.

Status: the CPU path is tested (engine outputs equal plain decoding); the CUDA path (capture,
replay, the kernels) is validated on an H100 (docs/benchmarks.md, 2026-11-22). ``LLM`` turns it on by default for a target on a CUDA device,
with or without speculation (``target_graph=False`` turns it off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import torch

from specd.engine.draft_graph import DraftGraphRunner
from specd.engine.graph_inputs import PackedStaging, capture_graph, wants_capture
from specd.engine.scheduler import TARGET, WorkItem
from specd.errors import InvalidArgumentError
from specd.kv_cache import KVCachePool
from specd.models.kernel_attention import DeviceAttentionMetadata, kernel_attention_for
from specd.models.llama import LlamaModel
from specd.verification import TokenTree

# Fields of the packed int64 input, in order (sizes in _Buffers). draft_column: for device-
# resident drafts (run(..., drafts=)), each request's column of the drafts, or column 0 when it
# has none (its rows 1..k are dummy rows: any token in the vocabulary will do).
_FIELDS = ("input_ids", "positions", "slot_mapping", "logits_index", "tree_mask", "kv_lens", "block_table",
           "draft_column")


@dataclass(frozen=True)
class TargetGraphConfig:
    """Shapes of the target graph runner.

    max_query: the largest q (root + draft nodes of one request) it runs; a larger tree runs
        the plain path.
    max_blocks: block-table width of its buffers (target pages per sequence at most).
    buckets: batch sizes a batch is padded to (and, when capturing, one graph each per q); a
        batch above the last bucket runs the plain path. Empty: no batch padding.
    capture: capture CUDA graphs; None: when the target model is on a CUDA device.
    max_tokens: the most padded query rows (bucket x q) a step may have; more run the plain
        path. Bounds the shared logits buffer of the graphs (max_tokens x vocab, logits_dtype).
        None: no bound (the last bucket x max_query).
    capture_query: ``capture_all`` captures q = 1..capture_query; longer ones (up to
        max_query) are captured when first run. None: max_query. (LLM: the speculation's own
        largest tree; jump-forward chains of structured outputs, which may be longer, are
        captured when a request first has one.)
    """

    max_query: int
    max_blocks: int
    buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    capture: Optional[bool] = None
    max_tokens: Optional[int] = None
    capture_query: Optional[int] = None


class _Buffers(PackedStaging):
    """Fixed-shape inputs of one (bucket, q): a packed int64 host staging buffer and its device
    copy, typed views of it, and the int32 tensors the attention op reads."""

    def __init__(self, batch: int, q: int, width: int, device: torch.device):
        tokens, words = batch * q, -(-q // 64)
        self.batch, self.q, self.words = batch, q, words
        shapes = ((tokens,),) * 4 + ((tokens, words), (batch,), (batch, width), (batch,))
        super().__init__(dict(zip(_FIELDS, shapes)), device)
        self.kv_lens = torch.zeros(batch, dtype=torch.int32, device=device)              # [B]
        self.block_table = torch.full((batch, width), -1, dtype=torch.int32, device=device)  # [B, W]
        self.query_start = torch.arange(0, tokens + 1, q, dtype=torch.int32, device=device)  # [B + 1]
        self._layouts: dict[tuple[int, ...], tuple] = {}  # sizes -> layout()

    def layout(self, sizes: list[int]) -> tuple[np.ndarray, Union[np.ndarray, slice], Optional[np.ndarray]]:
        """For trees of ``sizes`` nodes in item order: every node's index in its tree, int64
        ``[sum(sizes)]``; the nodes' rows (request i owns rows [i q, (i + 1) q)), an index
        array, or a slice for a single request (whose rows are its node indices); and the
        chain mask words of the nodes (node j sees nodes 0..j: 2^(j+1) - 1; None when q > 62).
        Steps repeat the same sizes, so layouts are kept (up to 256 of them)."""
        key = tuple(sizes)
        cached = self._layouts.get(key)
        if cached is None:
            counts = np.array(sizes, dtype=np.int64)
            node = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            dest = slice(0, len(node)) if len(sizes) == 1 else np.repeat(np.arange(len(sizes)) * self.q, counts) + node
            bits = (np.int64(1) << (node + 1)) - 1 if self.q <= 62 else None
            if len(self._layouts) >= 256:
                self._layouts.clear()
            cached = self._layouts[key] = (node, dest, bits)
        return cached


class TargetGraphRunner:
    """Runs pure verify steps of ``run_target`` over fixed-shape buffers (see module doc)."""

    def __init__(self, model: LlamaModel, pool: KVCachePool, config: TargetGraphConfig):
        reason = DraftGraphRunner.unsupported(model)
        if reason is not None:
            raise InvalidArgumentError(f"the target graph cannot run this target model: {reason}")
        if (config.max_query < 1 or config.max_blocks < 1 or any(b < 1 for b in config.buckets)
                or (config.max_tokens is not None and config.max_tokens < 1)
                or (config.capture_query is not None and config.capture_query < 1)):
            raise InvalidArgumentError(f"invalid TargetGraphConfig {config}")
        self.model, self.pool, self.config = model, pool, config
        self.device = model.device
        self.capture = wants_capture(config.capture, self.device, config.buckets, "target model")
        self.kv = pool.layers(TARGET)
        self.block_size = pool.block_size(TARGET)
        self.backend = kernel_attention_for(model)
        self._buffers: dict[tuple[int, int], _Buffers] = {}
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._mempool = None  # one graph memory pool shared by every captured graph
        self._logits: Optional[torch.Tensor] = None  # [rows, vocab] logits_dtype: every graph's output

    def bucket(self, batch: int) -> Optional[int]:
        if not self.config.buckets:
            return batch
        return next((b for b in sorted(self.config.buckets) if b >= batch), None)

    def query_len(self, items: Sequence[WorkItem], trees: dict[int, TokenTree]) -> int:
        """q of a step: its largest tree (root included)."""
        return max(len(trees[it.request.id]) for it in items)

    def accepts(self, items: Sequence[WorkItem], trees: dict[int, TokenTree]) -> bool:
        """True for a pure verify step that fits the buffers (see module doc)."""
        if not items or any(not it.decide or it.num_prefix for it in items):
            return False
        q, batch = self.query_len(items, trees), self.bucket(len(items))
        if q > self.config.max_query or batch is None:
            return False
        if self.config.max_tokens is not None and batch * q > self.config.max_tokens:
            return False
        bs, width = self.block_size, self.config.max_blocks
        return all(-(-(it.request.computed[TARGET] + it.num_tokens) // bs) <= width for it in items)

    def run(self, items: Sequence[WorkItem], trees: dict[int, TokenTree], drafts=None) -> torch.Tensor:
        """The verify forward of ``items`` (``accepts`` true). Returns logits (the model's
        ``logits_dtype``) ``[sum of tree sizes, vocab]`` in item order, as ``run_target``: a view of the runner's
        buffers on CUDA, valid until its next run.

        ``drafts`` (model_runner.DeviceDrafts): chains of some items still on the device, their
        trees' draft tokens placeholders; they are copied into the uploaded input ids on the
        device (``_put_drafts``) before the forward, with no host synchronisation."""
        q = self.query_len(items, trees)
        batch = self.bucket(len(items))
        buf = self._buffers_for(batch, q)
        graph = self._graph(batch, q) if self.capture else None
        rows = self._fill(buf, items, trees, drafts)
        if drafts is not None:
            self._put_drafts(buf, drafts.tokens)
        if graph is not None:
            graph.replay()
            logits = self._logits
        else:  # eager: into the shared buffer too when batches are bucketed (bounded shapes)
            logits = self._forward(buf, self._shared_logits()[:batch * q] if self.config.buckets else None)
        return logits[:rows]

    def capture_all(self, sampling_modes: Sequence[bool] = (False,)) -> int:
        """Captures the graph of every (bucket, q) a run can use (q = 1..capture_query, within
        max_tokens) that is not captured yet; returns how many it captured. Verification reads
        the logits whatever the sampling, so ``sampling_modes`` changes nothing here (the
        argument matches DraftGraphRunner.capture_all)."""
        if not self.capture:
            raise InvalidArgumentError("capture_all: this runner does not capture CUDA graphs")
        before = len(self._graphs)
        last = min(self.config.max_query, self.config.capture_query or self.config.max_query)
        for batch in self.config.buckets:
            for q in range(1, last + 1):
                if self.config.max_tokens is None or batch * q <= self.config.max_tokens:
                    self._graph(batch, q)
        return len(self._graphs) - before

    # ---- internals ----

    def _buffers_for(self, batch: int, q: int) -> _Buffers:
        buf = self._buffers.get((batch, q))
        if buf is None:
            buf = _Buffers(batch, q, self.config.max_blocks, self.device)
            self._buffers[(batch, q)] = buf
        return buf

    def _fill(self, buf: _Buffers, items: Sequence[WorkItem], trees: dict[int, TokenTree], drafts=None) -> int:
        """Writes the inputs of ``items`` (rows and requests past them: padding) to the staging
        buffer and copies it to the device. Returns the number of logits rows. Whole-step numpy
        operations: one per field, plus one per tree for the masks of trees that are not
        chains (a chain's node j sees nodes 0..j: bits 2^(j+1) - 1). With ``drafts``, also
        each request's column of them (``draft_column``)."""
        buf.begin()  # the previous run's copy has left the pinned staging
        f, q = buf.fields, buf.q
        if drafts is not None:
            column = {it.request.id: c for c, it in enumerate(drafts.items)}
            none = 0  # requests without drafts: their rows 1..k are dummies (_put_drafts)
            f["draft_column"].fill(none)
            f["draft_column"][:len(items)] = [column.get(it.request.id, none) for it in items]
        f["input_ids"].fill(0)
        f["positions"].fill(0)  # dummy rows and requests: any position in range
        f["slot_mapping"].fill(-1)
        f["logits_index"].fill(0)
        f["tree_mask"].fill(0)
        f["kv_lens"].fill(q)  # dummy requests: no history, nothing visible
        rows = 0
        if items:
            step = [trees[it.request.id] for it in items]
            n = len(items)
            sizes = [len(t) for t in step]
            history = np.array([it.request.computed[TARGET] for it in items], dtype=np.int64)
            node, dest, chain_bits = buf.layout(sizes)
            rows = len(node)
            chains = all(t.is_chain for t in step)
            f["input_ids"][dest] = np.concatenate([t.tokens for t in step])
            f["positions"][:n * q] = np.repeat(history, q)
            f["positions"][dest] += node if chains else np.concatenate([t.depths for t in step])
            f["slot_mapping"][dest] = np.concatenate([it.target_slots[:size] for it, size in zip(items, sizes)])
            if chains and chain_bits is not None:
                f["tree_mask"][dest, 0] = chain_bits
            else:
                for i, tree in enumerate(step):
                    bits = tree.ancestor_mask().view(np.int64)  # [size, ceil(size / 64)]
                    f["tree_mask"][i * q:i * q + len(tree), :bits.shape[1]] = bits
            f["kv_lens"][:n] = history + q
            f["logits_index"][:rows] = node if n == 1 else dest
        self.pool.blocks.block_table_into([it.request.id for it in items], f["block_table"], model=TARGET, pad=-1)
        buf.upload()
        return rows

    def _put_drafts(self, buf: _Buffers, tokens: torch.Tensor) -> None:
        """Device-resident drafts (int64 ``[k, n]``, column c: the c-th drafting item's chain)
        into the uploaded input ids: request r's rows 1..k get column ``draft_column[r]`` (column
        0 for requests without drafts). Rows past a request's tree are dummy rows (no slot,
        seen by no real row), so what lands there does not matter; tokens are clamped into the
        vocabulary so that no row indexes the embedding out of range (a real draft out of
        range, from a failed draft row, is rejected by verification on the host). Three
        device ops (a padded zero column for draftless requests made it four)."""
        k = tokens.shape[0]
        if 1 + k > buf.q:
            raise InvalidArgumentError(f"{k} device drafts per request do not fit verify rows of {buf.q} nodes")
        if tokens.shape[1] == 0:  # no drafting request: every request's rows past its root are dummies
            return
        d = buf.device
        picked = tokens.index_select(1, d["draft_column"])  # [k, B]
        picked.clamp_(0, self.model.config.vocab_size - 1)
        d["input_ids"].view(buf.batch, buf.q)[:, 1:1 + k].copy_(picked.T)

    def _forward(self, buf: _Buffers, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The target forward on the buffers: the code a CUDA graph captures. Logits
        (``logits_dtype``) ``[T, vocab]`` (rows past the step's logits rows: unused), written to ``out`` if given."""
        d = buf.device
        buf.kv_lens.copy_(d["kv_lens"])  # int64 -> int32, on the device
        buf.block_table.copy_(d["block_table"])
        meta = DeviceAttentionMetadata(d["positions"], d["slot_mapping"], buf.block_table, buf.query_start,
                                       buf.kv_lens, tree_mask=d["tree_mask"])
        return self.model(d["input_ids"], meta, self.kv, d["logits_index"], backend=self.backend, logits_out=out)

    def _graph(self, batch: int, q: int) -> torch.cuda.CUDAGraph:
        key = (batch, q)
        graph = self._graphs.get(key)
        if graph is not None:
            return graph
        buf = self._buffers_for(batch, q)
        out = self._shared_logits()[:batch * q]
        self._fill(buf, [], {})  # every request a dummy: the warm-up and the capture write no KV
        graph, self._mempool = capture_graph(lambda: self._forward(buf, out), self.device, self._mempool)
        self._graphs[key] = graph
        return graph

    def _shared_logits(self) -> torch.Tensor:
        if self._logits is None:
            rows = max(self.config.buckets) * self.config.max_query
            if self.config.max_tokens is not None:
                rows = min(rows, self.config.max_tokens)
            self._logits = torch.empty((rows, self.model.config.vocab_size), dtype=self.model.logits_dtype,
                                       device=self.device)
        return self._logits
