"""Runs the models over a step's work items: one varlen target forward over every item's new
tokens (prefix chunk, then the root and its draft tree), and the draft model's k-step loop.

Target layout of item i (its new tokens, in the order their K/V slots were reserved):
    tokens[c : c + num_prefix]                     positions c ...          (causal)
    tree nodes 0..n-1 (node 0 = the last token)     positions L-1 + depth    (tree mask)
where c is the target's committed length. Logits are returned for the tree nodes only.

The draft loop (``run_draft``) keeps sampled tokens as tensors: iteration j feeds the tokens
sampled in iteration j-1 without copying them to the host, so on a GPU the loop has no host
synchronisation (issue 7 captures it in CUDA graphs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from specd.engine.request import Request
from specd.engine.draft_sampling import pack_draft_rows, sample_draft_rows
from specd.engine.scheduler import DRAFT, TARGET, WorkItem
from specd.engine.timer import causal_keys
from specd.engine.torch_sampling import row_argmax
from specd.errors import InvalidArgumentError
from specd.kv_cache import KVCachePool
from specd.models.attention import AttentionMetadata
from specd.models.kernel_attention import DeviceAttentionMetadata, kernel_attention_for
from specd.models.kernel_choice import kernels_of
from specd.models.llama import LlamaModel
from specd.uploads import to_device, upload_packed
from specd.verification import TokenTree


@dataclass
class Segment:
    """One sequence's new tokens in a forward pass."""

    seq: int
    input_ids: torch.Tensor            # int64 [q]
    positions: torch.Tensor            # int64 [q]
    slots: np.ndarray                  # int64 [q]
    kv_len: int                        # history + q
    mask: Optional[torch.Tensor]       # bool [q, t] over the extent's last t >= q keys, None = causal
    key_positions: Optional[torch.Tensor] = None  # int64 [kv_len], for sliding windows
    logits_from: Optional[int] = None  # rows [logits_from, q) need logits; None: none


def segment_keys(segments: list[Segment]) -> int:
    """Keys the segments' new tokens attend, counted causally over each segment's KV extent
    (timer.causal_keys; a tree's nodes attend at most that many): the attention work a timer
    prices. Host integers only: no tensor op per segment on the draft loop's path."""
    return sum(causal_keys(s.kv_len - len(s.input_ids), len(s.input_ids)) for s in segments)


def kernel_attention_wanted(model: LlamaModel, segments: list[Segment]) -> bool:
    """Whether ``forward`` attends with specd's tree-attention kernel by default: on a CUDA
    device when specd has its CUDA kernels, for a model without a sliding window (causal
    segments and token trees alike: tree_mask_rows). Sliding windows and CPU runs use the
    model's backend (TorchPagedAttention)."""
    import specd.ops as ops

    return model.device.type == "cuda" and ops.HAS_CUDA_KERNELS and model.window is None


def tree_mask_rows(segments: list[Segment]) -> Optional[np.ndarray]:
    """KernelAttention's ``tree_mask`` for a batch where some segment carries a mask: int64
    ``[T, words]`` over the batch's new tokens, bit m of row t set when token t may see node m
    of its segment's tree (tree_attention.h: the last ``tree_len(s)`` keys of its extent),
    words enough for the largest tree. A masked segment's rows are its ``mask`` rows; a causal
    segment's are causal. None when every segment is causal (the kernel's causal rule needs
    no mask)."""
    if all(s.mask is None for s in segments):
        return None
    words = max(-(-tree_len(s) // 64) for s in segments)
    rows = []
    for s in segments:
        q = len(s.input_ids)
        if s.mask is None:
            rows.append(_causal_rows(q, words))
            continue
        bits = np.zeros((q, 64 * words), dtype=bool)
        bits[:, :tree_len(s)] = s.mask.cpu().numpy()
        # Little-endian bit order and bytes: bit m of the row is bit m % 64 of word m // 64.
        rows.append(np.packbits(bits, axis=1, bitorder="little").view("<i8"))
    return np.concatenate(rows)


def tree_len(segment: Segment) -> int:
    """The keys a segment's mask covers (the last of its extent): its mask's width, or its new
    tokens when it is causal."""
    return segment.mask.shape[1] if segment.mask is not None else len(segment.input_ids)


def _causal_rows(q: int, words: int) -> np.ndarray:
    """Causal mask rows as int64 words ``[q, words]``: row i has bits 0..i, word by word
    (a long prefill chunk beside a token tree costs q x words integers, not q x q bits)."""
    ones = np.clip(np.arange(q)[:, None] + 1 - 64 * np.arange(words)[None, :], 0, 64)  # bits set per word
    partial = np.left_shift(np.int64(1), np.minimum(ones, 63).astype(np.int64)) - 1
    return np.where(ones == 64, np.int64(-1), partial).astype(np.int64)


def forward(model: LlamaModel, pool: KVCachePool, model_index: int, segments: list[Segment],
            kernel: Optional[bool] = None) -> torch.Tensor:
    """Runs ``model`` over the segments; returns logits (``model.logits_dtype``: float32 on the
    CPU, the model's dtype on a GPU) of the rows asked for, in segment order ``[sum of rows,
    vocab]``. ``kernel``: attend through KernelAttention
    (models/kernel_attention.py: the kernel the graph runners replay; on the CPU its float32
    reference); None: ``kernel_attention_wanted``."""
    device = model.device
    query_start, logits_rows = [0], []
    for s in segments:
        if s.logits_from is not None:
            logits_rows.extend(range(query_start[-1] + s.logits_from, query_start[-1] + len(s.input_ids)))
        query_start.append(query_start[-1] + len(s.input_ids))
    if kernel is None:
        kernel = kernel_attention_wanted(model, segments)
    if kernel and model.window is not None:
        raise InvalidArgumentError("kernel attention has no sliding window")
    slots = np.concatenate([s.slots for s in segments])
    if kernel:
        # KernelAttention's metadata: device tensors, int32 block tables padded with -1, CSR
        # query offsets, KV extents; with the input ids (when they are on the host) and the
        # logits rows, all uploaded in one copy (int64; the int32 fields converted on the device).
        tables = pool.blocks.block_table_padded([s.seq for s in segments], model=model_index, pad=-1)
        mask = tree_mask_rows(segments)
        fed = any(tree_len(s) != len(s.input_ids) for s in segments)  # a tree fed a frontier at a time
        host_ids = all(s.input_ids.device.type == "cpu" for s in segments)
        arrays = [np.concatenate([s.positions.numpy() for s in segments]), slots, np.asarray(logits_rows),
                  tables, np.asarray(query_start), np.fromiter((s.kv_len for s in segments), np.int64)]
        arrays += [mask] if mask is not None else []
        arrays += [np.fromiter((tree_len(s) for s in segments), np.int64)] if fed else []
        arrays += [np.concatenate([s.input_ids.numpy() for s in segments])] if host_ids else []
        uploaded = upload_packed(device, arrays)
        positions, slot_mapping, indices, tables_d, starts, kv_lens = uploaded[:6]
        rest = uploaded[6:]
        meta = DeviceAttentionMetadata(positions=positions, slot_mapping=slot_mapping,
                                       block_tables=tables_d.to(torch.int32), query_start=starts.to(torch.int32),
                                       kv_lens=kv_lens.to(torch.int32))
        if mask is not None:
            meta.tree_mask = rest.pop(0)
        if fed:
            meta.tree_lens = rest.pop(0).to(torch.int32)
        input_ids = rest.pop(0) if host_ids else torch.cat([s.input_ids for s in segments]).to(device)
        return model(input_ids, meta, pool.layers(model_index), indices, backend=kernel_attention_for(model))
    # The torch attention path (the model's own backend: models that replay recorded forwards,
    # bench load --simulated, take no backend argument).
    tables = pool.blocks.block_table_padded([s.seq for s in segments], model=model_index)
    meta = AttentionMetadata(
        query_start=query_start,
        kv_lens=[s.kv_len for s in segments],
        block_tables=torch.from_numpy(tables).to(device=device, dtype=torch.int64),
        slot_mapping=torch.from_numpy(slots).to(device),
        positions=torch.cat([s.positions for s in segments]).to(device),
        masks=[s.mask for s in segments],
        key_positions=[s.key_positions for s in segments] if model.window else None,
        has_skipped_slots=bool((slots < 0).any()))
    input_ids = torch.cat([s.input_ids for s in segments]).to(device)
    indices = torch.tensor(logits_rows, dtype=torch.int64, device=device)
    return model(input_ids, meta, pool.layers(model_index), indices)


def target_segment(item: WorkItem, tree: Optional[TokenTree], windowed: bool) -> Segment:
    req, c, n = item.request, item.request.computed[TARGET], item.num_prefix
    tokens = req.tokens
    ids = tokens[c:c + n]
    positions = list(range(c, c + n))
    mask, key_positions, logits_from = None, None, None
    if req.wants_prompt_rows and n:  # the prefix's rows too, first (prompt logprobs)
        logits_from = 0
    if item.decide:
        ids = ids + tree.tokens.tolist()
        last = req.length - 1
        positions += (last + tree.depths).tolist()
        logits_from = 0 if logits_from == 0 else n
        if not tree.is_chain:
            size = len(tree)
            mask = torch.ones(n + size, n + size, dtype=torch.bool).tril()
            bits = tree.ancestor_mask()  # [size, words] uint64
            nodes = torch.arange(size)
            words = torch.from_numpy(bits.view(np.int64))[:, nodes // 64]
            mask[n:, n:] = ((words >> (nodes % 64)) & 1).bool()
            if windowed:
                key_positions = torch.tensor(list(range(c + n)) + positions[n:], dtype=torch.int64)
    return Segment(req.id, torch.tensor(ids, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64),
                   item.target_slots[:len(ids)], c + len(ids), mask, key_positions, logits_from)


@dataclass
class DeviceDrafts:
    """The chains of a draft call while they are still on the device: the draft graph runner's
    sampled tokens, which the target graph runner copies into its verify inputs on the device
    (``run_target(..., drafts=)``), so the host reads them once, after the verify forward is
    queued, instead of waiting for them between the draft call and the target forward.

    tokens: int64 ``[k, n]`` on the model's device, a view of the runner's buffers (valid until
        its next run); column i holds ``items[i]``'s drafts in its first ``items[i].k`` rows
        (rows past them: the runner's samples for an inactive row, never verified).
    items: the draft call's work items, in column order.
    probs, totals: when some item samples, the distributions float32 ``[k, n, vocab]`` the
        drafts were drawn from and their float64 totals ``[k, n]`` (views of the runner's
        ``[steps, B, vocab]`` / ``[steps, B]`` buffers, :meth:`rows`); else None."""

    tokens: torch.Tensor
    items: list[WorkItem]
    probs: Optional[torch.Tensor] = None
    totals: Optional[torch.Tensor] = None
    _host: Optional[list[list[int]]] = field(default=None, repr=False)  # read() keeps them

    def rows(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The distributions as rows of one ``[R, vocab]`` tensor and their totals ``[R]`` (views
        of the runner's buffers, no copy), and the row stride B: draft j of column i is row
        ``j * B + i`` of both (verify_stochastic's draft_index and draft_totals)."""
        k, _, vocab = self.probs.shape
        stride = self.probs.stride(0) // vocab
        return (self.probs.as_strided((k * stride, vocab), (vocab, 1)),
                self.totals.as_strided((k * stride,), (1,)), stride)

    def to_host(self) -> list[list[int]]:
        """Each item's drafts (one device -> host read, which waits for the work queued before
        it, unless read() has already read them)."""
        return self.read()[0]

    def read(self, extra: Optional[torch.Tensor] = None) -> tuple[list[list[int]], Optional[torch.Tensor]]:
        """Each item's drafts and, read in the same copy, ``extra`` (an int64 tensor on the same
        device, e.g. the verification results queued after the verify forward) as a CPU tensor.
        The drafts are kept: a later call without ``extra`` copies nothing."""
        if self._host is not None and extra is None:
            return self._host, None
        k, n = self.tokens.shape
        flat = self.tokens.T.reshape(-1)
        if extra is not None:
            flat = torch.cat([flat, extra.reshape(-1)])
        host = flat.cpu()  # the one wait
        rows = host[:k * n].view(n, k).tolist()
        self._host = [row[:it.k] for row, it in zip(rows, self.items)]
        return self._host, (host[k * n:] if extra is not None else None)


def graph_takes(graph, model: LlamaModel, pool: KVCachePool, items: list[WorkItem],
                trees: dict[int, TokenTree]) -> bool:
    """Whether ``run_target`` runs ``items`` through the target graph runner ``graph``."""
    return graph is not None and graph.model is model and graph.pool is pool and graph.accepts(items, trees)


def run_target(model: LlamaModel, pool: KVCachePool, items: list[WorkItem],
               trees: dict[int, TokenTree], graph=None, drafts: Optional[DeviceDrafts] = None) -> torch.Tensor:
    """Float32 logits of every deciding item's tree nodes, in item order ``[sum of sizes, vocab]``.
    An item whose request still wants prompt logprobs (``Request.wants_prompt_rows``) has its
    prefix chunk's rows first in its span (the engine takes them out: prompt_rows).

    ``graph``: a TargetGraphRunner (engine/target_graph.py) that runs pure verify steps (no
    prefill chunk in the batch) over fixed-shape buffers (a CUDA graph replay on GPUs); the
    engine passes its runner when ``LLM(..., target_graph=...)`` is on (by default on
    CUDA devices); steps it does not accept (prefill, another model or pool, q or batch
    size past its buffers) run the varlen forward below.

    ``drafts``: the chains of ``drafts.items`` are still on the device and their trees hold
    placeholder tokens; the runner copies the drafts into its inputs on the device. Only the
    runner can do that: ``graph_takes`` must hold."""
    if graph_takes(graph, model, pool, items, trees):
        return graph.run(items, trees, drafts)
    if drafts is not None:
        raise InvalidArgumentError("device-resident drafts need the target graph runner to take the step "
                                   "(read them to the host first: DeviceDrafts.to_host)")
    windowed = model.window is not None
    segments = [target_segment(it, trees.get(it.request.id), windowed) for it in items]
    return forward(model, pool, TARGET, segments)


def catch_up_segment(item: WorkItem, forced: Sequence[int] = ()) -> Segment:
    """Draft forward 0 of an item: the tokens [computed_d, L) the draft has not seen, then the
    ``forced`` drafts (fed as drafts 1.. would be, in their slots), ending with the last one
    (whose logits give the next draft)."""
    req = item.request
    start = req.computed[DRAFT]
    end = req.length + len(forced)
    return Segment(req.id, torch.tensor(req.tokens[start:] + list(forced), dtype=torch.int64),
                   torch.arange(start, end, dtype=torch.int64), item.draft_slots[:item.draft_catch_up + len(forced)],
                   end, None, logits_from=end - start - 1)


def run_draft(model: LlamaModel, pool: KVCachePool, items: list[WorkItem],
              on_forward: Optional[Callable[[int, Callable[[], torch.Tensor], int], torch.Tensor]] = None,
              graph=None, grammar=None) -> tuple[list[list[int]], list[Optional[torch.Tensor]]]:
    """The draft model proposes a chain of item.k tokens for each item (k > 0). Returns the
    drafts and, for stochastic requests, the draft distributions ``[k, vocab]`` they were
    sampled from (row j: the distribution of draft j+1); None for greedy requests. When the
    graph runner ran the whole call they are views of its buffers (run_draft_on_device).
    ``on_forward(tokens, run, keys)``, when given, wraps each forward (the engine times them;
    keys: segment_keys).

    ``graph``: a DraftGraphRunner (engine/draft_graph.py) that runs the draft forwards over
    fixed-shape buffers (one CUDA graph replay on GPUs); the engine passes its runner when
    ``LLM(..., draft_graph=...)`` is on (by default on CUDA devices). When every
    request's catch-up fits its buffers (``graph.catch_up_width``) the runner runs all k
    forwards, forward 0 included; otherwise forward 0 runs here and the runner forwards
    1..k-1. Batches the runner does not accept (another model or pool, k or batch size past
    its buffers) run the plain loop.

    ``grammar``: a grammar_drafts.DraftGrammar for requests with structured outputs. Their
    chains start with the tokens their grammar forces (DraftGrammar.forced, at most k): forward
    0 feeds them after the catch-up, as drafts 1.. would be fed, and each is a certain
    proposal (a one-hot draft distribution); the draft model proposes the rest, its rows
    masked to what the grammar allows after the drafts so far (read on the host after each
    forward). A call with such a request runs the plain loop."""
    device = model.device
    steps = max(it.k for it in items)
    paths = {i: [] for i, it in enumerate(items) if it.request.params.structured_outputs is not None} \
        if grammar is not None else {}
    forced = {i: grammar.forced(items[i].request, items[i].k) for i in paths}
    m = [len(forced.get(i, ())) for i in range(len(items))]  # forced drafts per item
    if paths:
        graph = None
        for i, f in forced.items():
            paths[i].extend(f)
    whole = run_draft_on_device(model, pool, items, on_forward, graph)
    if whole is not None:  # all k forwards in the runner, forward 0 too
        drafts, dists = whole
        return drafts.to_host(), dists  # the one host sync, after the loop
    if graph is not None and (graph.model is not model or graph.pool is not pool or not graph.accepts(items)):
        graph = None
    # Item i's drafts: m[i] forced ones, then one drawn per forward j < k - m[i]; forward 0
    # runs for every item (its catch-up), the others for those still drawing.
    sampled: list[list[torch.Tensor]] = [[torch.tensor(t, dtype=torch.int64, device=device) for t in forced.get(i, ())]
                                         for i in range(len(items))]
    dists: list[list[torch.Tensor]] = [[] for _ in items]
    for j in range(1 if graph is not None else steps):
        active = [i for i, it in enumerate(items) if j == 0 or it.k - m[i] > j]
        if not active:
            break
        segments = []
        for i in active:
            it, req = items[i], items[i].request
            if j == 0:  # catch up on the tokens the draft has not seen (and the forced drafts)
                segments.append(catch_up_segment(it, forced[i][:it.k - 1] if m[i] else ()))
                continue
            pos = req.length - 1 + m[i] + j  # the position of the token fed
            positions = torch.tensor([pos], dtype=torch.int64)
            slots = it.draft_slots[it.draft_catch_up + m[i] + j - 1:it.draft_catch_up + m[i] + j]
            segments.append(Segment(req.id, sampled[i][m[i] + j - 1].reshape(1), positions, slots, pos + 1, None,
                                    logits_from=0))
        tokens = sum(len(seg.input_ids) for seg in segments)
        run = lambda: forward(model, pool, DRAFT, segments)  # noqa: E731
        logits = on_forward(tokens, run, segment_keys(segments)) if on_forward is not None else run()
        drawing = [(row, i) for row, i in enumerate(active) if items[i].k - m[i] > j]
        if paths:
            grammar.mask(logits, [(row, items[i].request, paths[i]) for row, i in drawing if i in paths])
        greedy = row_argmax(logits) if any(items[i].request.params.greedy for _, i in drawing) else None
        rows = [row for row, i in drawing if not items[i].request.params.greedy]
        if rows:  # one kernel call for the sampled rows; key (seed, request, DRAFT_STREAM, position drawn)
            reqs = [(items[active[row]].request, m[active[row]]) for row in rows]
            params, keys = pack_draft_rows([r.params for r, _ in reqs], [r.rng_seed for r, _ in reqs],
                                           [r.rng_request for r, _ in reqs], [r.length + f + j for r, f in reqs],
                                           device)
            index = to_device(torch.tensor(rows, dtype=torch.int64), device)
            kernels = kernels_of(model)
            drawn, probs = sample_draft_rows(logits.index_select(0, index), params, keys,
                                             cluster=kernels.cluster_rows, gumbel=kernels.draw == "gumbel")
        at = {row: n for n, row in enumerate(rows)}
        for row, i in drawing:
            if items[i].request.params.greedy:
                sampled[i].append(greedy[row])
                continue
            sampled[i].append(drawn[at[row]])
            dists[i].append(probs[at[row]])
        for _, i in drawing:
            if i in paths and items[i].k > m[i] + j + 1:  # the next forward's row continues this path
                paths[i].append(int(sampled[i][m[i] + j]))
        if j == 0 and any(m):
            vocab = logits.shape[-1]
            for i, f in forced.items():  # the forced drafts' one-hot distributions first
                if f and not items[i].request.params.greedy:
                    dists[i][:0] = [_one_hot(t, vocab, device) for t in f]
    if graph is not None:
        return _finish_with_graph(graph, items, sampled, dists, on_forward)
    drafts = [torch.stack(s).tolist() for s in sampled]  # the one host sync, after the loop
    return drafts, [torch.stack(d) if d else None for d in dists]


def _one_hot(token: int, vocab: int, device: torch.device) -> torch.Tensor:
    """float32 ``[vocab]``: a certain proposal's draft distribution."""
    row = torch.zeros(vocab, dtype=torch.float32, device=device)
    row[token] = 1.0
    return row


def run_draft_on_device(model: LlamaModel, pool: KVCachePool, items: list[WorkItem],
                        on_forward: Optional[Callable[[int, Callable[[], torch.Tensor], int], torch.Tensor]] = None,
                        graph=None) -> Optional[tuple[DeviceDrafts, list[Optional[torch.Tensor]]]]:
    """``run_draft`` through the draft graph runner ``graph`` when it runs the whole call (every
    request's catch-up fits its buffers), without reading the drafts on the host: the drafts
    as :class:`DeviceDrafts` and the distributions as ``run_draft``'s, both views of the
    runner's buffers (no copy: valid until its next run, which the engine queues after the
    step's verification has read them). None when the runner does not run the whole call
    (nothing has run then)."""
    if (graph is None or graph.model is not model or graph.pool is not pool or not graph.accepts(items)
            or graph.catch_up_width(items) is None):
        return None
    tokens, probs, totals = graph.run(items, None, on_forward)  # [k, n], [k, n, vocab] or None, [k, n] or None
    drafts = DeviceDrafts(tokens, list(items), probs, totals)
    if probs is None:
        return drafts, [None] * len(items)
    columns = probs.unbind(1)  # [k, vocab] views, one per item, made in one call
    steps = len(probs)
    return drafts, [None if it.request.params.greedy else (columns[i] if it.k == steps else columns[i][:it.k])
                    for i, it in enumerate(items)]


def _finish_with_graph(graph, items: list[WorkItem], sampled: list[list[torch.Tensor]],
                       dists: list[list[torch.Tensor]], on_forward,
                       ) -> tuple[list[list[int]], list[Optional[torch.Tensor]]]:
    """Forwards 1..k-1 of the draft call through the draft graph runner, after forward 0 in
    run_draft (``sampled``/``dists``: forward 0's tokens and distributions)."""
    first = torch.stack([s[0] for s in sampled])  # [n] forward 0's tokens, on the device
    tokens, probs, _ = graph.run(items, first, on_forward)  # [k - 1, n], [k - 1, n, vocab] or None
    rows = torch.cat([first[None], tokens]).T.tolist()  # the one host sync, after the loop
    drafts = [row[:it.k] for row, it in zip(rows, items)]
    out_dists: list[Optional[torch.Tensor]] = []
    for i, it in enumerate(items):
        if not dists[i]:
            out_dists.append(None)
            continue
        out_dists.append(torch.cat([dists[i][0][None], probs[:it.k - 1, i]]))  # a copy: buffers are reused
    return drafts, out_dists
