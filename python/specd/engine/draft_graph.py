"""The draft model's k forwards of a draft call as one fixed-shape, graph-capturable run.

``run_draft`` (model_runner.py) proposes k tokens per request. Forward 0 catches the draft up
on the c_i tokens it has not seen (variable: 1..k+1 after a verify step) and samples the first
draft from the last one; forwards 1..k-1 feed one token per request, the one it sampled in the
previous forward. This module runs them over preallocated buffers of a batch-size bucket:

    forward 0 (when W = max c_i <= max_catch_up), all on the device:
      model forward              each request's catch-up padded to W rows (dummy rows: token
                                 0, slot -1, after the real ones: a causal chain no real row
                                 sees past), KernelAttention, LM head on each last real row
      sample                     as below, key (seed, request, DRAFT_STREAM, req.length)
    per forward j = 1..k-1:
      draft_step_inputs_inplace  positions += 1, input ids = sampled tokens, slots through the
                                 block tables, kv_lens (rows past their own k: slot -1)
      model forward              KernelAttention: kv_write + causal tree_attention ops, with
                                 metadata in device tensors only
      sample                     greedy argmax, or the sampling kernel (draft_sampling.py:
                                 each row's token and distribution, no sort) with each
                                 row's parameters and Philox key held in tensors

Nothing in it reads a value on the host, so on CUDA :class:`DraftGraphRunner` captures it in
``torch.cuda.CUDAGraph``s and replays them; the inputs of a run are ONE pinned host->device
copy of a packed int64 buffer (per-row fields, block tables, forward 0's ids / positions /
slots / logits rows / kv_lens). By default each forward is its own graph: the head (inputs
into the bucket's buffers, then forward 0 when W > 0) per (bucket, W, sampling), and forward
j per (bucket, j, sampling), shared by every k and W, so far fewer graphs are captured.
``graph_per_forward=False`` captures the whole call as one graph per (bucket, W, k,
sampling); on an H100 both measured the same host overhead per draft step (the GPU starts on
a large graph before its launch returns; docs/benchmarks.md). A catch-up wider than
``max_catch_up`` (after a prefill) runs forward 0 eagerly in run_draft and forwards 1..k-1
here (W = 0). On CPU the same code runs eagerly (used to test it against the plain loop).

Status: the CPU path is tested (engine greedy outputs and drafts equal to the plain loop);
the CUDA path (capture, replay, no host sync) is validated on an H100 (docs/benchmarks.md, 2026-11-22). ``LLM`` turns it on by default for a
draft model on a CUDA device (``draft_graph=False`` turns it off).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from specd.engine.graph_inputs import PackedStaging, capture_graph, wants_capture
from specd.engine.draft_sampling import key_words, param_words, sample_draft_rows
from specd.engine.scheduler import DRAFT, WorkItem
from specd.engine.timer import causal_keys
from specd.errors import InvalidArgumentError
from specd.kv_cache import KVCachePool
from specd.models.kernel_attention import DeviceAttentionMetadata, kernel_attention_for
from specd.models.kernel_choice import kernels_of
from specd.models.llama import LlamaModel
from specd.ops import host_call

# Columns of the per-row int64 inputs: the packed specd::SamplingParams (temperature, top_k,
# top_p, min_p; floats as float64 bits) and words 0-1 of the packed specd::RngKey (seed;
# request | DRAFT_STREAM << 32), each adjacent so that the loop copies it as one slice
# (indexing with a list would copy an index tensor to the device).
_START, _NUM_STEPS, _TEMPERATURE, _TOP_K, _TOP_P, _MIN_P, _SEED, _KEY_WORD = range(8)
_COLUMNS = 8
# One row of those inputs as bytes (native int64 / float64: the staging's layout).
_ROW = struct.Struct("=2qdqdd2q")
assert _ROW.size == 8 * _COLUMNS
_IDLE_ROW = _ROW.pack(0, 0, 0.0, 0, 1.0, 0.0, 0, 0)  # padding: no steps, greedy


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
    buckets: batch sizes a batch is padded to (and, when capturing, one graph each per catch-up
        width, k and sampling mode); a batch above the last bucket runs the plain loop. Empty:
        no padding.
    capture: capture CUDA graphs; None: when the draft model is on a CUDA device.
    max_catch_up: the widest forward 0 it runs (W, the largest number of tokens a request of
        the batch catches up on); a wider one (e.g. right after a prefill) runs forward 0
        eagerly in run_draft and forwards 1..k-1 here. None: max_steps + 1 (the most a verify
        step leaves: k accepted drafts and the bonus token); 0: forward 0 always eager.
    graph_per_forward: when capturing, one graph per forward (module doc; the default) or one
        graph for the whole call. The eager path runs the same pieces either way.
    """

    max_steps: int
    max_blocks: int
    buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    capture: Optional[bool] = None
    max_catch_up: Optional[int] = None
    graph_per_forward: bool = True


class _Buffers:
    """Work tensors and outputs of one batch bucket (shared by every catch-up width)."""

    def __init__(self, batch: int, width: int, steps: int, device: torch.device):
        self.table = torch.full((batch, width), -1, dtype=torch.int32, device=device)  # [B, blocks]
        self.positions = torch.zeros(batch, dtype=torch.int64, device=device)     # [B]
        self.input_ids = torch.zeros(batch, dtype=torch.int64, device=device)     # [B]
        self.slot_mapping = torch.full((batch,), -1, dtype=torch.int64, device=device)
        self.kv_lens = torch.zeros(batch, dtype=torch.int32, device=device)       # [B]
        self.query_start = torch.arange(batch + 1, dtype=torch.int32, device=device)  # one token each
        # The run's per-row fields, copied in by the head: what forwards j >= 1 read (their
        # graphs are shared by every catch-up width, so they cannot read one width's inputs).
        self.rows = torch.zeros((batch, _COLUMNS), dtype=torch.int64, device=device)  # [B, _COLUMNS]
        self.params = torch.zeros((batch, 4), dtype=torch.int64, device=device)  # [B, 4] packed SamplingParams
        self.keys = torch.zeros((batch, 3), dtype=torch.int64, device=device)    # [B, 3] packed RngKey
        self.num_steps = torch.zeros(batch, dtype=torch.int32, device=device)       # [B] each row's k
        # Row j: forward j's samples (row 0: forward 0's, written by the catch-up or copied in).
        self.tokens = torch.zeros((steps, batch), dtype=torch.int64, device=device)
        self.probs: Optional[torch.Tensor] = None  # float32 [steps, B, vocab], on first sampled run
        self.totals: Optional[torch.Tensor] = None  # float64 [steps, B]: each row of probs' total


class _Inputs(PackedStaging):
    """The inputs of a run for one (bucket, catch-up width W), packed in ONE int64 buffer copied
    host -> device once per run (from pinned staging on CUDA): the per-row table ``rows``
    ``[B, _COLUMNS]``, the draft block tables ``[B, blocks]`` and, when W > 0, forward 0's
    ``[B W]`` input ids, positions and slots, ``[B]`` logits rows and kv_lens. Request i owns
    query rows [i W, (i + 1) W); its c_i real rows come first (a causal chain), then dummy rows
    (token 0, slot -1: nothing written, and no real row sees them)."""

    def __init__(self, batch: int, width: int, blocks: int, device: torch.device):
        sizes = {"rows": (batch, _COLUMNS), "table": (batch, blocks)}
        if width:
            sizes.update(ids=(batch * width,), positions=(batch * width,), slots=(batch * width,),
                         logits_index=(batch,), kv_lens=(batch,))
        super().__init__(sizes, device)
        self.width = width
        if width:
            self.kv_lens = torch.zeros(batch, dtype=torch.int32, device=device)
            self.query_start = torch.arange(0, batch * width + 1, width, dtype=torch.int32, device=device)
            # forward 0's fields, adjacent in the staging from "ids" on, as one packed record
            self.catch_up = struct.Struct(f"={3 * batch * width + 2 * batch}q")


class DraftGraphRunner:
    """Runs the draft forwards of ``run_draft`` over fixed-shape buffers (see module doc)."""

    def __init__(self, model: LlamaModel, pool: KVCachePool, config: DraftGraphConfig):
        reason = self.unsupported(model)
        if reason is not None:
            raise InvalidArgumentError(f"the draft graph cannot run this draft model: {reason}")
        if (config.max_steps < 1 or config.max_blocks < 1 or any(b < 1 for b in config.buckets)
                or (config.max_catch_up is not None and config.max_catch_up < 0)):
            raise InvalidArgumentError(f"invalid DraftGraphConfig {config}")
        self.model, self.pool, self.config = model, pool, config
        self.device = model.device
        self.capture = wants_capture(config.capture, self.device, config.buckets, "draft model")
        self.max_catch_up = config.max_steps + 1 if config.max_catch_up is None else config.max_catch_up
        self.kv = pool.layers(DRAFT)
        self.block_size = pool.block_size(DRAFT)
        self.num_pages = pool.blocks.num_pages
        self.backend = kernel_attention_for(model)
        self._buffers: dict[int, _Buffers] = {}
        self._inputs: dict[tuple[int, int], _Inputs] = {}
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
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

    def catch_up_width(self, items: Sequence[WorkItem]) -> Optional[int]:
        """W of forward 0 (the largest catch-up of ``items``) when the runner runs it, else None
        (forward 0 then runs eagerly in run_draft)."""
        counts = [it.request.length - it.request.computed[DRAFT] for it in items]
        if not counts or min(counts) < 1 or max(counts) > self.max_catch_up:
            return None
        return max(counts)

    def accepts(self, items: Sequence[WorkItem]) -> bool:
        """True when the runner runs the draft call of ``items``: all of it (``run(items)``), or
        forwards 1..k-1 after an eager forward 0 (``run(items, first_tokens)``, k >= 2)."""
        if not items or self.bucket(len(items)) is None:
            return False
        steps = max(it.k for it in items)
        if not 1 <= steps <= self.config.max_steps:
            return False
        return steps >= 2 or self.catch_up_width(items) is not None

    def run(self, items: Sequence[WorkItem], first_tokens: Optional[torch.Tensor] = None,
            on_forward: Optional[Callable[[int, Callable[[], object], int], object]] = None,
            ) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """The draft forwards of ``items`` (k = the largest item.k; ``accepts`` true).

        ``first_tokens`` None (``catch_up_width(items)`` not None): all k forwards, forward 0
        (the catch-up) included. Else ``first_tokens`` (int64 ``[n]`` on the device) are the
        tokens an eager forward 0 sampled, and the runner runs forwards 1..k-1.

        Returns views of the runner's buffers, valid until its next run: tokens int64
        ``[f, n]`` for the f forwards run (row r: the samples of forward r, or r + 1 when
        ``first_tokens`` is given; item i's drafts are column i's first rows) and, when some
        item samples, their float32 distributions ``[f, n, vocab]`` and the rows' float64 totals
        ``[f, n]`` (sampling_probs' totals, what verify_stochastic takes as draft_totals; else
        None for both).
        ``on_forward(tokens, run, keys)`` is called once per forward as in run_draft; the first call
        runs everything (a graph replay cannot be split), the others run nothing."""
        n, steps = len(items), max(it.k for it in items)
        sampling = any(not it.request.params.greedy for it in items)
        width = 0
        if first_tokens is None:
            width = self.catch_up_width(items)
            if width is None:
                raise InvalidArgumentError("the draft graph runner needs forward 0's tokens for this batch")
        batch = self.bucket(n)
        buf = self._buffers_for(batch, sampling)
        inp = self._inputs_for(batch, width)
        graphs = self._graphs_for(batch, width, steps, sampling) if self.capture else None
        self._fill(inp, items)
        if first_tokens is not None:
            buf.tokens[0, :n].copy_(first_tokens)
            buf.tokens[0, n:].zero_()

        first = 0 if width else 1
        shapes = self._shapes(items, steps, first) if on_forward is not None else []
        self._run_timed(lambda: self._loop(graphs, buf, inp, steps, sampling), shapes, on_forward)
        if not sampling:
            return buf.tokens[first:steps, :n], None, None
        return buf.tokens[first:steps, :n], buf.probs[first:steps, :n], buf.totals[first:steps, :n]

    def capture_all(self, sampling_modes: Sequence[bool] = (False,)) -> int:
        """Captures every graph a run can replay that is not captured yet, for each bucket and
        sampling mode given: with graph_per_forward the head of each catch-up width
        0..max_catch_up and forwards 1..max_steps-1; else the whole call of each (width, k).
        Returns how many it captured."""
        if not self.capture:
            raise InvalidArgumentError("capture_all: this runner does not capture CUDA graphs")
        before = len(self._graphs)
        per_forward = self.config.graph_per_forward
        for batch in self.config.buckets:
            for sampling in sampling_modes:
                for width in range(self.max_catch_up + 1):
                    for steps in ((self.config.max_steps,) if per_forward else range(1, self.config.max_steps + 1)):
                        if steps >= 2 or width > 0:  # what accepts() lets run
                            self._graphs_for(batch, width, steps, sampling)
        return len(self._graphs) - before

    # ---- internals ----

    def _loop(self, graphs: Optional[list], buf, inp: _Inputs, steps: int, sampling: bool) -> None:
        """The call's device work: the graphs replayed in order, or the eager body."""
        if graphs is not None:
            for graph in graphs:
                graph.replay()
        else:
            self._body(buf, inp, steps, sampling)

    @staticmethod
    def _shapes(items: Sequence[WorkItem], steps: int, first: int) -> list[tuple[int, int]]:
        """Per forward ``first .. steps - 1``: (tokens, keys attended; model_runner.segment_keys).
        Forward 0 catches each item up on its tokens [computed_d, L); forward j >= 1 feeds each
        item still drafting (k > j) one token at position L - 1 + j. One pass over the items."""
        tokens, lengths = [0] * steps, [0] * steps  # forward j: items drafting, the sum of their L
        shapes = []
        if first == 0:
            caught = keys = 0
            for it in items:
                start = it.request.computed[DRAFT]
                c = it.request.length - start
                caught += c
                keys += causal_keys(start, c)
            shapes.append((caught, keys))
        for it in items:
            length = it.request.length
            for j in range(1, it.k):  # (it.k <= steps)
                tokens[j] += 1
                lengths[j] += length
        return shapes + [(tokens[j], lengths[j] + j * tokens[j]) for j in range(1, steps)]

    @staticmethod
    def _run_timed(loop: Callable[[], None], shapes: list, on_forward) -> None:
        """Runs ``loop`` once. With ``on_forward``, reports the call's forwards ``shapes``
        ((tokens, keys) each) through it: the first report runs the whole loop (a graph replay
        cannot be split), the others run nothing."""
        if on_forward is None or not shapes:
            loop()
            return
        on_forward(shapes[0][0], loop, shapes[0][1])
        for tokens, keys in shapes[1:]:
            on_forward(tokens, lambda: None, keys)

    def _buffers_for(self, batch: int, sampling: bool) -> _Buffers:
        buf = self._buffers.get(batch)
        if buf is None:
            buf = _Buffers(batch, self.config.max_blocks, self.config.max_steps, self.device)
            self._buffers[batch] = buf
        if sampling and buf.probs is None:
            vocab = self.model.config.vocab_size
            buf.probs = torch.zeros((buf.tokens.shape[0], batch, vocab), dtype=torch.float32, device=self.device)
            buf.totals = torch.zeros((buf.tokens.shape[0], batch), dtype=torch.float64, device=self.device)
        return buf

    def _inputs_for(self, batch: int, width: int) -> _Inputs:
        inp = self._inputs.get((batch, width))
        if inp is None:
            inp = _Inputs(batch, width, self.config.max_blocks, self.device)
            self._inputs[(batch, width)] = inp
        return inp

    def _fill(self, inp: _Inputs, items: Sequence[WorkItem]) -> None:
        """Inputs of ``items`` (requests past them: inactive padding), copied to the device.
        Host work on every draft call: rows are packed with one ``struct.pack_into`` each
        (floats as their float64 bits, no numpy scalars), forward 0's fields built as Python
        lists and packed with one more (they are adjacent in the staging)."""
        inp.begin()  # the previous run's copy has left the pinned staging
        f, n, w = inp.fields, len(items), inp.width
        batch = len(f["rows"])
        raw, at = inp.raw, inp.byte_offset["rows"]
        raw[at + n * _ROW.size:at + batch * _ROW.size] = _IDLE_ROW * (batch - n)
        for i, it in enumerate(items):
            req = it.request
            _ROW.pack_into(raw, at + i * _ROW.size, req.length - 1, it.k, *self._param_words(req.params),
                           *key_words(req.rng_seed, req.rng_request))
        self.pool.blocks.block_table_into([it.request.id for it in items], f["table"], model=DRAFT, pad=-1)
        if w:
            # Dummy requests: no history, no pages, nothing visible (kv_len w, slots -1).
            ids, positions, slots = [0] * (batch * w), [0] * (batch * w), [-1] * (batch * w)
            kv_lens, logits_index = [w] * batch, list(range(0, batch * w, w))
            for i, it in enumerate(items):
                req = it.request
                start, base = req.computed[DRAFT], i * w
                c = req.length - start
                ids[base:base + c] = req.tokens[start:]
                positions[base:base + c] = range(start, req.length)
                positions[base + c:base + w] = [req.length - 1] * (w - c)  # dummy rows: the last real position
                slots[base:base + c] = it.draft_slots[:c].tolist()
                kv_lens[i] = start + w
                logits_index[i] = base + c - 1
            inp.catch_up.pack_into(raw, inp.byte_offset["ids"], *ids, *positions, *slots, *logits_index, *kv_lens)
        inp.upload()

    def _body(self, buf: _Buffers, inp: _Inputs, steps: int, sampling: bool) -> None:
        """The whole call on the buffers: the head, then forwards 1..steps-1 (what one graph
        captures; with a graph per forward, the pieces are captured and replayed in this order)."""
        self._head(buf, inp, sampling)
        for j in range(1, steps):
            self._forward(buf, j, sampling)

    @staticmethod
    def _param_words(params) -> tuple:
        """The packed SamplingParams words of a request's rows (draft_sampling.param_words)."""
        return param_words(params)

    def _head(self, buf: _Buffers, inp: _Inputs, sampling: bool) -> None:
        """The run's inputs into the bucket's buffers, then forward 0 when the inputs have a
        catch-up width (its samples into ``buf.tokens[0]``)."""
        self._load(buf, inp)
        if inp.width:
            logits = self._catch_up(buf, inp)  # [B, vocab]
            # The key of run_draft's eager forward 0: (seed, request, DRAFT_STREAM, req.length).
            self._sample(buf, 0, logits, sampling, buf.positions + 1)

    def _load(self, buf, inp: _Inputs) -> None:
        """The run's per-row fields and block tables into the bucket's buffers (on the device)."""
        d = inp.device
        rows = d["rows"]
        buf.table.copy_(d["table"])  # int64 -> int32, on the device
        buf.rows.copy_(rows)
        buf.params.copy_(rows[:, _TEMPERATURE:_MIN_P + 1])  # one strided copy each
        buf.keys[:, :2].copy_(rows[:, _SEED:_KEY_WORD + 1])
        buf.positions.copy_(rows[:, _START])
        buf.num_steps.copy_(rows[:, _NUM_STEPS])  # int64 -> int32

    def _catch_up(self, buf, inp: _Inputs) -> torch.Tensor:
        """Forward 0 over the inputs' padded catch-up rows: logits ``[B, vocab]`` of each
        request's last real row."""
        d = inp.device
        inp.kv_lens.copy_(d["kv_lens"])
        meta = DeviceAttentionMetadata(d["positions"], d["slots"], buf.table, inp.query_start, inp.kv_lens)
        return self.model(d["ids"], meta, self.kv, d["logits_index"], backend=self.backend)

    def _forward(self, buf: _Buffers, j: int, sampling: bool) -> None:
        """Forward j >= 1: feeds forward j - 1's samples (``buf.tokens[j - 1]``), samples into
        ``buf.tokens[j]``. Reads only the bucket's buffers, so one graph serves every k and W."""
        host_call(torch.ops.specd.draft_step_inputs_inplace)(
            buf.table, buf.positions, buf.tokens[j - 1], buf.input_ids, buf.slot_mapping, buf.kv_lens,
            self.block_size, self.num_pages, j, buf.num_steps)
        meta = DeviceAttentionMetadata(buf.positions, buf.slot_mapping, buf.table, buf.query_start, buf.kv_lens)
        logits = self.model(buf.input_ids, meta, self.kv, None, backend=self.backend)  # [B, vocab]
        # Key (seed, request, DRAFT_STREAM, req.length + j), as run_draft's forward j.
        self._sample(buf, j, logits, sampling, buf.positions + 1)

    def _sample(self, buf: _Buffers, j: int, logits: torch.Tensor, sampling: bool, positions: torch.Tensor) -> None:
        if sampling:
            buf.keys[:, 2].copy_(positions)  # the position of the token drawn: word 2 of each key
            kernels = kernels_of(self.model)
            tokens, _ = sample_draft_rows(logits, buf.params, buf.keys, out=buf.probs[j], totals=buf.totals[j],
                                          cluster=kernels.cluster_rows, gumbel=kernels.draw == "gumbel")
        else:
            tokens = torch.argmax(logits, dim=-1)
        buf.tokens[j].copy_(tokens)

    def _graphs_for(self, batch: int, width: int, steps: int, sampling: bool) -> list[torch.cuda.CUDAGraph]:
        """The graphs a call replays in order, captured on first use (before the call's inputs
        are filled in: captures run with every request inactive and write no KV)."""
        buf, inp = self._buffers_for(batch, sampling), self._inputs_for(batch, width)
        if not self.config.graph_per_forward:
            return [self._captured(("call", batch, width, steps, sampling), inp,
                                   lambda: self._body(buf, inp, steps, sampling))]
        graphs = [self._captured(("head", batch, width, sampling), inp, lambda: self._head(buf, inp, sampling))]
        idle = self._inputs_for(batch, 0)
        for j in range(1, steps):
            graphs.append(self._captured(("forward", batch, j, sampling), idle,
                                         lambda j=j: self._forward(buf, j, sampling), prime=True))
        return graphs

    def _reset(self, buf: _Buffers) -> None:
        """Before a capture: outputs a replay of inactive rows would read."""
        buf.tokens.zero_()

    def _captured(self, key: tuple, inp: _Inputs, body: Callable[[], None],
                  prime: bool = False) -> torch.cuda.CUDAGraph:
        """The graph of ``key``, capturing ``body`` first if needed. ``inp`` is filled with no
        request first (every row inactive: the warm-up and the capture write no KV); ``prime``:
        run the head eagerly on it before the capture, so that the bucket's buffers, which a
        forward graph reads, hold inactive rows too."""
        graph = self._graphs.get(key)
        if graph is not None:
            return graph
        buf = self._buffers[key[1]]
        self._fill(inp, [])
        self._reset(buf)
        if prime:
            self._head(buf, inp, sampling=False)
        graph, self._mempool = capture_graph(body, self.device, self._mempool)
        self._graphs[key] = graph
        return graph
