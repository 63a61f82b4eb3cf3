"""The draft model's decode steps 1..k-1 as one fixed-shape, graph-capturable loop.

``run_draft`` (model_runner.py) runs draft forward 0 eagerly: it catches the draft up on the
tokens it has not seen (variable length). From forward 1 on, every request feeds exactly one
token, the one it sampled in the previous forward; that part is what this module runs over
preallocated buffers of a batch-size bucket:

    per forward j = 1..k-1, all on the device:
      draft_step_inputs_inplace  positions += 1, input ids = sampled tokens, slots through the
                                 block tables, kv_lens (rows past their own k: slot -1)
      model forward              KernelAttention: kv_write + causal tree_attention ops, with
                                 metadata in device tensors only
      sample                     greedy argmax, or per-row sampling (row_sampling.py) with
                                 each row's parameters and Philox key held in tensors

Nothing in the loop reads a value on the host, so on CUDA :class:`DraftGraphRunner` captures
it once per (bucket, k, sampling) in a ``torch.cuda.CUDAGraph`` and replays it; the inputs of
a run are one pinned host->device copy of the per-row fields and block tables. On CPU the
same loop runs eagerly (used to test it against the plain draft loop).

Status: the CPU path is tested (engine greedy outputs and drafts equal to the plain loop);
the CUDA path (kernels, capture, replay) is UNVALIDATED on a GPU so far, hence off by default
(``LLM(..., draft_graph=True)`` turns it on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from specd.engine.row_sampling import RowParams, sample_rows
from specd.engine.scheduler import DRAFT, WorkItem
from specd.engine.torch_sampling import DRAFT_STREAM
from specd.errors import InvalidArgumentError
from specd.kv_cache import KVCachePool
from specd.models.kernel_attention import DeviceAttentionMetadata, KernelAttention
from specd.models.llama import LlamaModel

# Columns of the per-row int64 inputs (float parameters as float64 bits, adjacent so that the
# loop reads them as one slice: indexing with a list would copy an index tensor to the device).
_START, _NUM_STEPS, _GREEDY, _TEMPERATURE, _TOP_P, _MIN_P, _TOP_K, _SEED_LO, _SEED_HI, _REQUEST = range(10)
_COLUMNS = 10
_ONE_BITS = int(np.array(1.0).view(np.int64))
_MASK = 0xFFFFFFFF


def _float_bits(x: float) -> int:
    return int(np.array(float(x), dtype=np.float64).view(np.int64))


def power_of_two_buckets(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to max_batch, and max_batch itself."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return tuple(out + [max_batch])


@dataclass(frozen=True)
class DraftGraphConfig:
    """Shapes of the draft graph runner.

    max_steps: the largest k (draft tokens per request) it runs; a larger k runs the plain loop.
    max_blocks: block-table width of its buffers (draft pages per sequence at most).
    buckets: batch sizes a batch is padded to (and, when capturing, one graph each per k and
        sampling mode); a batch above the last bucket runs the plain loop. Empty: no padding.
    capture: capture CUDA graphs; None: when the draft model is on a CUDA device.
    """

    max_steps: int
    max_blocks: int
    buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    capture: Optional[bool] = None


class _Buffers:
    """Fixed-shape inputs, work tensors and outputs of one batch bucket."""

    def __init__(self, batch: int, width: int, steps: int, device: torch.device):
        on_device = device.type != "cpu"
        self.host = torch.zeros((batch, _COLUMNS), dtype=torch.int64, pin_memory=on_device)
        self.host_table = torch.full((batch, width), -1, dtype=torch.int32, pin_memory=on_device)
        self.rows = torch.zeros_like(self.host, device=device) if on_device else self.host
        self.table = torch.full_like(self.host_table, -1, device=device) if on_device else self.host_table
        self.uploaded = torch.cuda.Event() if on_device else None  # the host staging may be rewritten
        self.first_tokens = torch.zeros(batch, dtype=torch.int64, device=device)  # [B] from forward 0
        self.positions = torch.zeros(batch, dtype=torch.int64, device=device)     # [B]
        self.input_ids = torch.zeros(batch, dtype=torch.int64, device=device)     # [B]
        self.slot_mapping = torch.full((batch,), -1, dtype=torch.int64, device=device)
        self.kv_lens = torch.zeros(batch, dtype=torch.int32, device=device)       # [B]
        self.query_start = torch.arange(batch + 1, dtype=torch.int32, device=device)  # one token each
        self.tokens = torch.zeros((max(steps - 1, 1), batch), dtype=torch.int64, device=device)
        self.probs: Optional[torch.Tensor] = None  # float32 [steps - 1, B, vocab], on first sampled run


class DraftGraphRunner:
    """Runs draft forwards 1..k-1 of ``run_draft`` over fixed-shape buffers (see module doc)."""

    def __init__(self, model: LlamaModel, pool: KVCachePool, config: DraftGraphConfig):
        reason = self.unsupported(model)
        if reason is not None:
            raise InvalidArgumentError(f"the draft graph cannot run this draft model: {reason}")
        if config.max_steps < 1 or config.max_blocks < 1 or any(b < 1 for b in config.buckets):
            raise InvalidArgumentError(f"invalid DraftGraphConfig {config}")
        self.model, self.pool, self.config = model, pool, config
        self.device = model.device
        self.capture = config.capture if config.capture is not None else self.device.type == "cuda"
        if self.capture and (self.device.type != "cuda" or not config.buckets):
            raise InvalidArgumentError("CUDA graph capture needs a CUDA draft model and batch buckets")
        self.kv = pool.layers(DRAFT)
        self.block_size = pool.block_size(DRAFT)
        self.num_pages = pool.blocks.num_pages
        self.backend = KernelAttention()
        self._buffers: dict[int, _Buffers] = {}
        self._graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}
        self._mempool = None  # one graph memory pool shared by every captured graph

    @staticmethod
    def unsupported(model) -> Optional[str]:
        """Why ``model`` cannot use the runner, or None."""
        import specd.ops as ops

        if not isinstance(model, LlamaModel):
            return f"{type(model).__name__} is not a LlamaModel"
        if model.window is not None:
            return "sliding-window attention is not in the attention kernel"
        if model.device.type == "cpu" and model.dtype != torch.float32:
            return f"the CPU attention reference is float32 only (model is {model.dtype})"
        if model.device.type == "cuda" and not ops.HAS_CUDA_KERNELS:
            return "this specd build has no CUDA kernels"
        if model.device.type not in ("cpu", "cuda"):
            return f"device {model.device} has no kernels"
        return None

    def bucket(self, batch: int) -> Optional[int]:
        if not self.config.buckets:
            return batch
        return next((b for b in sorted(self.config.buckets) if b >= batch), None)

    def accepts(self, items: Sequence[WorkItem]) -> bool:
        steps = max(it.k for it in items)
        return 2 <= steps <= self.config.max_steps and self.bucket(len(items)) is not None

    def run(self, items: Sequence[WorkItem], first_tokens: torch.Tensor,
            on_forward: Optional[Callable[[int, Callable[[], object]], object]] = None,
            ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Draft forwards 1..k-1 (k = the largest item.k) after forward 0 sampled
        ``first_tokens`` (int64 ``[n]`` on the device). Returns views of the runner's buffers,
        valid until its next run: tokens int64 ``[k - 1, n]`` (row j-1: forward j's samples;
        item i's drafts 2..k_i are column i's first k_i - 1 rows) and, when some item samples,
        their float32 distributions ``[k - 1, n, vocab]`` (else None). ``on_forward(tokens,
        run)`` is called once per forward as in run_draft; the first call runs the whole loop
        (a graph replay cannot be split), the others run nothing."""
        n, steps = len(items), max(it.k for it in items)
        sampling = any(not it.request.params.greedy for it in items)
        batch = self.bucket(n)
        buf = self._buffers_for(batch, sampling)
        graph = self._graph(batch, steps, sampling) if self.capture else None
        self._fill(buf, items)
        buf.first_tokens[:n].copy_(first_tokens)
        buf.first_tokens[n:].zero_()

        def loop() -> None:
            if graph is not None:
                graph.replay()
            else:
                self._loop(buf, steps, sampling)

        active = [sum(1 for it in items if it.k > j) for j in range(1, steps)]
        if on_forward is None:
            loop()
        else:
            on_forward(active[0], loop)
            for tokens in active[1:]:
                on_forward(tokens, lambda: None)
        probs = buf.probs[:steps - 1, :n] if sampling else None
        return buf.tokens[:steps - 1, :n], probs

    # ---- internals ----

    def _buffers_for(self, batch: int, sampling: bool) -> _Buffers:
        buf = self._buffers.get(batch)
        if buf is None:
            buf = _Buffers(batch, self.config.max_blocks, self.config.max_steps, self.device)
            self._buffers[batch] = buf
        if sampling and buf.probs is None:
            vocab = self.model.config.vocab_size
            buf.probs = torch.zeros((buf.tokens.shape[0], batch, vocab), dtype=torch.float32, device=self.device)
        return buf

    def _fill(self, buf: _Buffers, items: Sequence[WorkItem]) -> None:
        """Per-row inputs of ``items`` (rows past them: inactive padding), copied to the device."""
        if buf.uploaded is not None:
            buf.uploaded.synchronize()  # the previous run's copy has left the pinned staging
        n = len(items)
        rows = np.zeros((buf.host.shape[0], _COLUMNS), dtype=np.int64)
        rows[:, _GREEDY] = 1
        rows[:, _TEMPERATURE] = rows[:, _TOP_P] = _ONE_BITS
        for i, it in enumerate(items):
            req, p = it.request, it.request.params
            rows[i] = (req.length - 1, it.k, int(p.greedy), _float_bits(1.0 if p.greedy else p.temperature),
                       _float_bits(p.top_p), _float_bits(p.min_p), p.top_k, req.rng_seed & _MASK,
                       (req.rng_seed >> 32) & _MASK, req.rng_request & _MASK)
        buf.host.copy_(torch.from_numpy(rows))
        buf.host_table.fill_(-1)
        if n:
            table = self.pool.blocks.block_table_padded([it.request.id for it in items], model=DRAFT,
                                                        width=self.config.max_blocks, pad=-1)
            buf.host_table[:n] = torch.from_numpy(table)
        if buf.rows is not buf.host:
            buf.rows.copy_(buf.host, non_blocking=True)
            buf.table.copy_(buf.host_table, non_blocking=True)
            buf.uploaded.record()

    def _loop(self, buf: _Buffers, steps: int, sampling: bool) -> None:
        """Forwards 1..steps-1 on the buffers: the code a CUDA graph captures."""
        buf.positions.copy_(buf.rows[:, _START])
        num_steps = buf.rows[:, _NUM_STEPS].to(torch.int32)
        params = _row_params(buf.rows) if sampling else None
        sampled = buf.first_tokens
        meta = DeviceAttentionMetadata(buf.positions, buf.slot_mapping, buf.table, buf.query_start, buf.kv_lens)
        for j in range(1, steps):
            torch.ops.specd.draft_step_inputs_inplace(buf.table, buf.positions, sampled, buf.input_ids,
                                                      buf.slot_mapping, buf.kv_lens, self.block_size,
                                                      self.num_pages, j, num_steps)
            logits = self.model(buf.input_ids, meta, self.kv, None, backend=self.backend)  # [B, vocab]
            if params is not None:
                tokens, probs = sample_rows(logits, params, DRAFT_STREAM, buf.positions + 1)
                buf.probs[j - 1].copy_(probs)
            else:
                tokens = torch.argmax(logits, dim=-1)
            buf.tokens[j - 1].copy_(tokens)
            sampled = buf.tokens[j - 1]

    def _graph(self, batch: int, steps: int, sampling: bool) -> torch.cuda.CUDAGraph:
        key = (batch, steps, sampling)
        graph = self._graphs.get(key)
        if graph is not None:
            return graph
        buf = self._buffers_for(batch, sampling)
        self._fill(buf, [])  # every row inactive: the warm-up and the capture write no KV
        buf.first_tokens.zero_()
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self._loop(buf, steps, sampling)  # warm-up: lazy initialisations stay out of the capture
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._mempool):
            self._loop(buf, steps, sampling)
        if self._mempool is None:
            self._mempool = graph.pool()
        self._graphs[key] = graph
        return graph


def _row_params(rows: torch.Tensor) -> RowParams:
    """RowParams from the per-row int64 inputs [B, _COLUMNS]."""
    floats = rows[:, _TEMPERATURE:_MIN_P + 1].contiguous().view(torch.float64)  # temperature, top_p, min_p
    return RowParams(greedy=rows[:, _GREEDY] != 0, temperature=floats[:, 0], top_k=rows[:, _TOP_K],
                     top_p=floats[:, 1], min_p=floats[:, 2], seed_lo=rows[:, _SEED_LO], seed_hi=rows[:, _SEED_HI],
                     request=rows[:, _REQUEST])
