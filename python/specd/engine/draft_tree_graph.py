"""Draft-model token trees grown on the device: the k forwards of ``run_draft_tree``
(draft_tree.py) as fixed-shape, graph-capturable work with one host read per draft call.

The host loop (draft_tree.py) reads each forward's candidates to the host and asks the C++
DraftTreeBuilder for the next frontier: one synchronisation per forward. This runner keeps
the whole growth on the device, per batch-size bucket B, tree width w and fed-node capacity
N = (max_steps - 1) w:

    forward 0 (catch-up)  as DraftGraphRunner's (padded to W rows per request; or, when the
                          catch-up is wider than its buffers, the root logits of an eager
                          forward 0 copied in); the root's candidates: ``tree_children``
                          (draft_tree.py: the request's distribution, top w)
    forward j = 1..k-1    select the frontier from forward j - 1's candidates (below), feed
                          it (w rows per request) under the tree mask over every node fed so
                          far (``tree_lens`` = j w: the earlier nodes' KV is in the cache from
                          their own forward), their candidates by ``tree_children``

Fixed layout. Frontier position f of forward j is fed node (j - 1) w + f of its request: depth
j, position ``L - 1 + j``, KV index ``L + (j - 1) w + f`` (its slot through the block table, the
slot run_draft_tree gives it when every frontier is full), mask row = its parent's row plus its
own bit, over the request's j w tree nodes. Forward j feeds the w frontier rows of each
request: ``query_start`` is the constant 0, w, 2w, ..., ``kv_lens`` L + j w and ``tree_lens``
j w (tree_attention.h: the last j w KV positions are the tree, the queries its last w). The
host loop feeds the same frontiers, packed (no dummy rows), so the attention is the same up to
rounding.
Rows of nodes that do not exist (a frontier with fewer than w candidates, a request past its
own k or whose candidates all had probability 0, a padding request) are dummies: token 0,
slot -1 (nothing written), an empty mask row (they see the history only; no row sees them,
since an invalid node is nobody's ancestor).

Frontier selection (DraftTreeBuilder.frontier's rule, and draft_tree._Growth.next_frontier's
chain rule), per request, over forward j - 1's candidates ``[F w]`` (F = 1 for the root, else
w; candidate f w + r = rank r of frontier node f, so flat order = the builder's node order):
the w valid candidates of largest path probability (path = parent's path x probability, in
float64 as the builder multiplies; invalid: probability 0, or parent not fed), ties by flat
index (a stable descending sort); if the draft's greedy chain continues (rank 0 of the chain's
node is valid) and is not among them, it replaces the last one.

What the host reads, once per call (run returns it on the device; run_draft_tree copies it):
``record`` float64 ``[k, B, 2 w w + w]``; row j of a
request holds forward j's candidates (``[w, w]`` tokens, then ``[w, w]`` probabilities; row 0:
the root's in the first w) and the frontier forward j fed (flat candidate indices of forward
j - 1, -1 none). ``_Growth.replay`` expands a DraftTreeBuilder in the host loop's order from it,
so the trees built and sized afterwards are the host loop's, from the same candidates.

On CUDA each forward is a CUDA graph (the head per (bucket, W), forward j per (bucket, j),
shared by every k and W: they read only the bucket's buffers), as in DraftGraphRunner; on the
CPU the same code runs eagerly (tested against the host loop). Status: CPU-tested (every
draft call grows the host loop's trees) and run on an H100 (replay equals the eager runner
bit for bit, no host sync; greedy outputs equal plain decoding): LLM's default on CUDA.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import torch

from specd.engine.draft_graph import _COLUMNS, DraftGraphConfig, DraftGraphRunner, _Inputs
from specd.engine.draft_tree import tree_children, tree_param_words
from specd.engine.scheduler import DRAFT, WorkItem
from specd.engine.timer import causal_keys
from specd.errors import InvalidArgumentError
from specd.kv_cache import KVCachePool
from specd.models.kernel_attention import DeviceAttentionMetadata
from specd.models.kernel_choice import kernels_of
from specd.models.llama import LlamaModel


def record_width(width: int) -> int:
    """Columns of a request's record row: ``[w, w]`` tokens, ``[w, w]`` probabilities, ``[w]``
    frontier."""
    return 2 * width * width + width


class _TreeBuffers:
    """Work tensors and outputs of one batch bucket (shared by every catch-up width)."""

    def __init__(self, batch: int, blocks: int, steps: int, width: int, vocab: int, device: torch.device):
        nodes = max(steps - 1, 1) * width  # fed nodes at most (forwards 1..steps-1, w each)
        words = -(-nodes // 64)
        cands = width * width
        i64 = dict(dtype=torch.int64, device=device)
        # What DraftGraphRunner._load writes (rows' fields, block tables).
        self.table = torch.full((batch, blocks), -1, dtype=torch.int32, device=device)  # [B, blocks]
        self.rows = torch.zeros((batch, _COLUMNS), **i64)
        self.params = torch.zeros((batch, 4), **i64)       # [B, 4] packed SamplingParams (tree_param_words)
        self.keys = torch.zeros((batch, 3), **i64)         # unused: candidates are not sampled
        self.positions = torch.zeros(batch, **i64)         # [B] L - 1, the root's position
        self.num_steps = torch.zeros(batch, dtype=torch.int32, device=device)  # [B] each row's k
        self.root_logits = torch.zeros((batch, vocab), dtype=torch.float32, device=device)  # eager forward 0's
        self.record = torch.zeros((steps, batch, record_width(width)), dtype=torch.float64, device=device)
        # Candidates of the last forward, flat [B, w w] (f w + r: rank r of frontier node f).
        self.cand_tokens = torch.zeros((batch, cands), **i64)
        self.cand_path = torch.zeros((batch, cands), dtype=torch.float64, device=device)
        self.cand_ok = torch.zeros((batch, cands), dtype=torch.bool, device=device)
        self.chain = torch.full((batch,), -1, **i64)       # candidate continuing the greedy chain, -1 none
        # Fed nodes, in the fixed layout (module doc).
        self.node_tokens = torch.zeros((batch, nodes), **i64)
        self.node_path = torch.zeros((batch, nodes), dtype=torch.float64, device=device)
        self.node_ok = torch.zeros((batch, nodes), dtype=torch.bool, device=device)
        self.node_mask = torch.zeros((batch, nodes, words), **i64)  # ancestor bits over fed nodes
        self.kv_lens = torch.zeros(batch, dtype=torch.int32, device=device)
        # Constants: node i's own mask bit, KV index past the root (i + 1).
        bits = np.zeros((nodes, words), dtype=np.int64)
        for i in range(nodes):
            bits[i, i // 64] = np.int64(1 << (i % 64)) if i % 64 < 63 else np.int64(-2 ** 63)
        self.self_bits = torch.from_numpy(bits).to(device)
        self.kv_offset = torch.arange(nodes, **i64) + 1
        self.query_start = torch.arange(0, batch * width + 1, width, dtype=torch.int32, device=device)
        # Forward j's tree: the j w nodes fed up to it (tree_attention.h's tree_lens).
        self.tree_lens = {j: torch.full((batch,), j * width, dtype=torch.int32, device=device)
                          for j in range(1, steps)}


class DraftTreeGraphRunner(DraftGraphRunner):
    """Grows the draft trees of ``run_draft_tree`` on the device over fixed-shape buffers (see
    module doc); ``width``: the trees' width (SpeculationConfig.draft_tree_width, 2..8)."""

    def __init__(self, model: LlamaModel, pool: KVCachePool, config: DraftGraphConfig, width: int):
        super().__init__(model, pool, config)
        if not isinstance(width, int) or not 2 <= width <= 8:
            raise InvalidArgumentError(f"the draft tree graph needs a tree width in [2, 8], got {width!r}")
        self.width = width

    @staticmethod
    def _param_words(params) -> tuple:
        return tree_param_words(params)

    def run(self, items: Sequence[WorkItem], first_logits: Optional[torch.Tensor] = None,
            on_forward: Optional[Callable[[int, Callable[[], object], int], object]] = None) -> torch.Tensor:
        """Grows the trees of ``items`` (k = the largest item.k; ``accepts`` true). ``first_logits``
        None (``catch_up_width(items)`` not None): forward 0 runs here too; else float32
        ``[n, vocab]`` on the device are the root logits of an eager forward 0.
        Returns the record float64 ``[k, n, record_width(w)]`` (module doc) on the device, a view
        of the runner's buffers (valid until its next run), as DraftGraphRunner.run returns
        its tokens: nothing in the call synchronises with the host (run_draft_tree reads the
        record in one copy). ``on_forward(tokens, run, keys)``: once per forward as in
        run_draft_tree; the first call runs everything (a graph replay cannot be split)."""
        n, steps = len(items), max(it.k for it in items)
        width = 0
        if first_logits is None:
            width = self.catch_up_width(items)
            if width is None:
                raise InvalidArgumentError("the draft tree graph runner needs forward 0's logits for this batch")
        batch = self.bucket(n)
        buf = self._buffers_for(batch, False)
        inp = self._inputs_for(batch, width)
        graphs = self._graphs_for(batch, width, steps, False) if self.capture else None
        self._fill(inp, items)
        if first_logits is not None:
            buf.root_logits[:n].copy_(first_logits)
            buf.root_logits[n:].zero_()

        w = self.width
        # Per forward: (tokens fed, keys attended), counting a request's w rows in forward j,
        # after its history and (j - 1) w earlier tree nodes.
        shapes = [(sum(w for it in items if it.k > j),
                   sum(causal_keys(it.request.length + (j - 1) * w, w) for it in items if it.k > j))
                  for j in range(1, steps)]
        if width:
            shapes.insert(0, (sum(it.request.length - it.request.computed[DRAFT] for it in items),
                              sum(causal_keys(it.request.computed[DRAFT], it.request.length - it.request.computed[DRAFT])
                                  for it in items)))
        self._run_timed(lambda: self._loop(graphs, buf, inp, steps, False), shapes, on_forward)
        return buf.record[:steps, :n]

    def capture_all(self, sampling_modes: Sequence[bool] = (False,)) -> int:
        """Captures every graph a run can replay (candidates are not sampled: one mode)."""
        return super().capture_all((False,))

    # ---- internals ----

    def _buffers_for(self, batch: int, sampling: bool) -> _TreeBuffers:
        buf = self._buffers.get(batch)
        if buf is None:
            buf = _TreeBuffers(batch, self.config.max_blocks, self.config.max_steps, self.width,
                               self.model.config.vocab_size, self.device)
            self._buffers[batch] = buf
        return buf

    def _reset(self, buf: _TreeBuffers) -> None:
        buf.record.zero_()
        buf.root_logits.zero_()
        buf.cand_ok.zero_()
        buf.node_ok.zero_()
        buf.chain.fill_(-1)

    def _head(self, buf: _TreeBuffers, inp: _Inputs, sampling: bool) -> None:
        """The run's inputs into the bucket's buffers, the root logits (forward 0 when the
        inputs have a catch-up width, else ``root_logits``) and the root's candidates."""
        self._load(buf, inp)
        logits = self._catch_up(buf, inp) if inp.width else buf.root_logits  # [B, vocab]
        active = (buf.num_steps > 0)[:, None]  # [B, 1]
        self._expand(buf, 0, logits, torch.ones(active.shape, dtype=torch.float64, device=self.device), active)
        buf.chain.copy_(torch.where(buf.cand_ok[:, 0], 0, -1))  # the root's most probable child

    def _forward(self, buf: _TreeBuffers, j: int, sampling: bool) -> None:
        """Forward j >= 1: selects its frontier from forward j - 1's candidates, feeds the fed
        nodes and the frontier, expands the frontier (module doc)."""
        w = self.width
        batch = buf.table.shape[0]
        order = torch.sort(torch.where(buf.cand_ok, buf.cand_path, -1.0), dim=1, descending=True,
                           stable=True).indices[:, :w].contiguous()  # [B, w]
        live = (buf.num_steps > j)  # [B] requests still growing at depth j
        top_ok = buf.cand_ok.gather(1, order) & live[:, None]
        chain = buf.chain
        chain_ok = (chain >= 0) & buf.cand_ok.gather(1, chain.clamp(min=0)[:, None])[:, 0] & live
        replace = chain_ok & ~(order == chain[:, None]).any(dim=1)
        order[:, w - 1] = torch.where(replace, chain, order[:, w - 1])
        top_ok[:, w - 1] |= replace
        at = torch.argmax((order == chain[:, None]).to(torch.int32), dim=1)  # the chain's frontier position
        buf.chain.copy_(torch.where(chain_ok, at * w, -1))  # rank 0 of its node: where the chain goes next
        buf.record[j, :, 2 * w * w:].copy_(torch.where(top_ok, order, -1))
        lo, q = (j - 1) * w, j * w
        buf.node_tokens[:, lo:q] = buf.cand_tokens.gather(1, order)
        buf.node_path[:, lo:q] = buf.cand_path.gather(1, order)
        buf.node_ok[:, lo:q] = top_ok
        own = buf.self_bits[lo:q][None]  # [1, w, words]
        if j == 1:  # parents: the root (in the history, no bit)
            buf.node_mask[:, lo:q] = own
        else:
            parent = (j - 2) * w + torch.div(order, w, rounding_mode="floor")  # [B, w] fed index
            words = buf.node_mask.shape[2]
            ancestors = buf.node_mask.gather(1, parent[:, :, None].expand(-1, -1, words))
            buf.node_mask[:, lo:q] = ancestors | own
        # The forward's rows: the frontier, w per request (the tree's earlier nodes are in the
        # KV already: tree_lens = j w makes the mask rows cover them).
        ids = torch.where(top_ok, buf.node_tokens[:, lo:q], 0).reshape(-1)
        positions = (buf.positions + j)[:, None].expand(batch, w).reshape(-1)
        kv_index = buf.positions[:, None] + buf.kv_offset[None, lo:q]  # [B, w]
        column = torch.div(kv_index, self.block_size, rounding_mode="floor")
        in_table = column < buf.table.shape[1]
        page = buf.table.gather(1, column.clamp(max=buf.table.shape[1] - 1)).to(torch.int64)
        slots = torch.where(top_ok & in_table & (page >= 0), page * self.block_size + kv_index % self.block_size, -1)
        buf.kv_lens.copy_(buf.positions + 1 + q)
        mask = torch.where(top_ok[:, :, None], buf.node_mask[:, lo:q], 0).reshape(batch * w, -1)
        meta = DeviceAttentionMetadata(positions, slots.reshape(-1), buf.table, buf.query_start, buf.kv_lens,
                                       tree_mask=mask, tree_lens=buf.tree_lens[j])
        logits = self.model(ids, meta, self.kv, None, backend=self.backend)  # [B w, vocab]
        self._expand(buf, j, logits, buf.node_path[:, lo:q], top_ok)

    def _expand(self, buf: _TreeBuffers, j: int, logits: torch.Tensor, parent_path: torch.Tensor,
                parent_ok: torch.Tensor) -> None:
        """Candidates of F nodes per request: logits ``[B F, vocab]``, their path probabilities
        float64 ``[B, F]`` and whether they exist ``[B, F]`` -> ``cand_*`` (columns past F w
        invalid) and record row j."""
        w = self.width
        batch, fanout = parent_path.shape
        params = buf.params if fanout == 1 else buf.params.repeat_interleave(fanout, dim=0)
        tokens, probs = tree_children(logits, params, w, kernels_of(self.model).cluster_rows)  # [B F, <= w]
        if tokens.shape[1] < w:  # a vocabulary smaller than the width
            pad = w - tokens.shape[1]
            tokens = torch.nn.functional.pad(tokens, (0, pad))
            probs = torch.nn.functional.pad(probs, (0, pad))
        tokens, probs = tokens.view(batch, fanout * w), probs.view(batch, fanout * w)
        ok = (probs > 0) & parent_ok.repeat_interleave(w, dim=1)
        cols = fanout * w
        buf.cand_tokens[:, :cols] = tokens
        buf.cand_path[:, :cols] = parent_path.repeat_interleave(w, dim=1) * probs.double()
        buf.cand_ok[:, :cols] = ok
        buf.cand_ok[:, cols:] = False
        record = buf.record[j]
        ww = w * w
        record[:, :ww].zero_()
        record[:, ww:2 * ww].zero_()
        record[:, :cols] = tokens
        record[:, ww:ww + cols] = probs.double()
        if j == 0:
            record[:, 2 * ww:] = -1
