"""Draft-model token trees (SpeculationConfig.draft_tree_width > 1): the draft grows a tree of
depth k per request, EAGLE-2 style, with the C++ DraftTreeBuilder
(cpp/include/specd/draft_tree_builder.h) keeping the nodes of highest path probability.

Per request, with width w and depth k:
- forward 0 is the chain's catch-up (model_runner.catch_up_segment); the root's w most
  probable children are the first frontier;
- forward j = 1..k-1 feeds every node fed so far plus the w most probable unexpanded nodes of
  the deepest depth (DraftTreeBuilder.frontier; the draft's greedy path, the chain a width
  of 1 would propose, always among them), under a tree mask (each node sees the history
  and its own ancestors), and expands each new node into its w most probable children. Re-feeding earlier nodes keeps the mask within the forward's new tokens, which is
  what the attention takes; a node keeps its KV slot (the catch-up's, then one per fed node
  in feeding order), so the draft writes at most (k - 1) w slots past its catch-up;
- the tree verified is the item's `nodes` best nodes by path probability
  (DraftTreeBuilder.build) under a static k, or the nodes the policy's ``size_trees``
  picks from every grown node's path probability and parent (the goodput policy ranks
  them by its per-depth acceptance shared by the draft's confidence; goodput_controller.h).

"Probable" is the draft's distribution the request would sample from (temperature, top-k,
top-p, min-p, by one specd::sampling_probs call per forward for the sampled rows; plain
softmax for greedy requests), so candidates are deterministic: verify
them without draft rows (one-hot proposals), which is lossless for greedy and sampled
requests alike. Only the catch-up's draft KV is kept; the accepted tokens are fed again as
the next step's catch-up. The draft's greedy chain is marked in each tree: the policy's
per-depth acceptance hears how far that chain was accepted (DraftTree.chain_result), so it
stays the acceptance of the chain that a width of 1 would propose.

The tree loop reads each forward's candidates on the host (one sync per forward), and is not
run by the CUDA-graph draft runner, which captures chains. On CUDA its forwards attend with the
tree-attention kernel, the tree masks as the kernel's tree_mask rows (model_runner.forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from specd._core import DraftTreeBuilder
from specd.engine.draft_sampling import pack_params
from specd.engine.model_runner import Segment, catch_up_segment, forward, segment_keys
from specd.engine.scheduler import DRAFT, WorkItem
from specd.kv_cache import KVCachePool
from specd.models.kernel_choice import kernels_of
from specd.ops import sampling_probs
from specd.models.llama import LlamaModel
from specd.verification import TokenTree


def _children(logits: torch.Tensor, owners: list[WorkItem], width: int,
              cluster: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The `width` most probable next tokens of each row of a forward's logits ``[rows, vocab]``
    (row r belongs to ``owners[r]``) and their probabilities, read to the host in one copy:
    int32 and float32 ``[rows, width]`` (probability 0 marks no candidate). The distributions:
    greedy requests' rows by one float64 softmax, sampled requests' rows by one
    ``specd::sampling_probs`` call (their sampling rules; a row the rules refuse, e.g. NaN
    logits, is zeros: no candidates); ``cluster``: that call's thread-block cluster per row."""
    device = logits.device
    rows = torch.zeros(logits.shape, dtype=torch.float64, device=device)
    greedy = [r for r, it in enumerate(owners) if it.request.params.greedy]
    sampled = [r for r, it in enumerate(owners) if not it.request.params.greedy]
    if greedy:
        index = torch.tensor(greedy, dtype=torch.int64, device=device)
        rows[index] = torch.softmax(logits.index_select(0, index).double(), dim=-1)
    if sampled:
        index = torch.tensor(sampled, dtype=torch.int64, device=device)
        params = pack_params([owners[r].request.params for r in sampled], device)
        probs, _ = sampling_probs(logits.index_select(0, index).float(), params, cluster)
        rows[index] = probs.double()
    top = torch.topk(rows, min(width, logits.shape[-1]), dim=-1)
    packed = torch.cat([top.indices.double(), top.values], dim=-1).cpu().numpy()  # the forward's one host read
    return packed[:, :top.indices.shape[-1]].astype(np.int32), packed[:, top.indices.shape[-1]:].astype(np.float32)


class _Growth:
    """One request's tree under construction: the builder and the nodes fed to the draft."""

    def __init__(self, item: WorkItem, width: int, windowed: bool):
        self.item, self.width, self.windowed = item, width, windowed
        self.builder = DraftTreeBuilder(item.request.tokens[-1])
        self.fed: list[int] = []    # builder nodes fed to the draft, in slot order
        self.parent: dict[int, int] = {}
        self.depth: dict[int, int] = {0: 0}
        self.token: dict[int, int] = {0: item.request.tokens[-1]}
        self.chain = 0  # the deepest node of the draft's greedy path (most probable child each time)
        self.on_chain = {0}  # every node of that path

    def expand(self, node: int, tokens: np.ndarray, probs: np.ndarray) -> None:
        """Adds the candidates (one row of _children) of an unexpanded node."""
        keep = probs > 0
        tokens, probs = tokens[keep], probs[keep]
        first = len(self.builder)
        self.builder.expand(node, tokens, probs)
        if node == self.chain:
            self.chain = first  # its most probable child (top-w comes sorted)
            self.on_chain.add(first)
        for child, token in zip(range(first, len(self.builder)), tokens.tolist()):
            self.parent[child] = node
            self.depth[child] = self.depth[node] + 1
            self.token[child] = token

    def segment(self) -> tuple[Segment, int]:
        """The next forward's segment (every fed node plus the new frontier) and how many
        frontier nodes it adds (their logits are its last rows)."""
        frontier = [int(n) for n in self.builder.frontier(self.width)]
        if self.chain not in frontier:  # the draft's greedy path is always grown (rules above)
            frontier[-1] = self.chain
        self.fed.extend(frontier)
        req, item = self.item.request, self.item
        index = {node: i for i, node in enumerate(self.fed)}
        n = len(self.fed)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i, node in enumerate(self.fed):
            while node != 0:
                mask[i, index[node]] = True
                node = self.parent[node]
        tokens = [self.token[node] for node in self.fed]
        positions = [req.length - 1 + self.depth[node] for node in self.fed]
        slots = item.draft_slots[item.draft_catch_up:item.draft_catch_up + n]
        keys = torch.tensor(list(range(req.length)) + positions, dtype=torch.int64) if self.windowed else None
        seg = Segment(req.id, torch.tensor(tokens, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64),
                      slots, req.length + n, mask, key_positions=keys, logits_from=n - len(frontier))
        return seg, len(frontier)


@dataclass
class DraftTree:
    """A draft tree to verify, what it predicts, and which of its nodes are the draft's greedy
    chain (the root and the most probable child of each chain node; the engine reports the
    chain's part to the policy's per-depth acceptance)."""

    tree: TokenTree
    predicted: float        # summed path probability of its drafts, or what size_trees said
    chain: frozenset[int]   # tree node indices on the draft's greedy path (the root included)

    def chain_result(self, path: np.ndarray) -> tuple[int, int]:
        """(chain drafts verified, of them accepted) for an accepted root-to-node ``path``."""
        depth = len(self.chain) - 1
        accepted = 0
        for node in path[1:].tolist():
            if node not in self.chain:
                break
            accepted += 1
        return depth, accepted


def run_draft_tree(model: LlamaModel, pool: KVCachePool, items: list[WorkItem], width: int,
                   on_forward: Optional[Callable[[int, Callable[[], torch.Tensor], int], torch.Tensor]] = None,
                   size: Optional[Callable[[list[WorkItem], list[np.ndarray], list[np.ndarray]],
                                           list[tuple[list[int], float]]]] = None,
                   ) -> list[DraftTree]:
    """The draft trees of ``items`` (each k > 0), in item order (rules above).
    ``size(items, path_probs, parents)``, when given (the policy's size_trees), gets every
    grown node's path probability and parent (-1: the root) and returns per tree the nodes
    to verify, parents first, and their predicted accepted drafts; otherwise the item.nodes
    nodes of highest path probability are verified. ``on_forward(tokens, run, keys)``, when
    given, wraps each forward (the engine times them; keys: model_runner.segment_keys)."""
    grow = [_Growth(it, width, model.window is not None) for it in items]

    def run(segments: list[Segment]) -> torch.Tensor:
        tokens = sum(len(seg.input_ids) for seg in segments)
        call = lambda: forward(model, pool, DRAFT, segments)  # noqa: E731
        return on_forward(tokens, call, segment_keys(segments)) if on_forward is not None else call()

    logits = run([catch_up_segment(it) for it in items])  # [n, vocab]: each root's next token
    cluster = kernels_of(model).cluster_rows
    tokens, probs = _children(logits, items, width, cluster)
    for i, g in enumerate(grow):
        g.expand(0, tokens[i], probs[i])
    for j in range(1, max(it.k for it in items)):
        active = [g for g in grow if g.item.k > j]
        planned = [g.segment() for g in active]
        logits = run([seg for seg, _ in planned])
        new = [(g, node) for g, (_, added) in zip(active, planned) for node in g.fed[len(g.fed) - added:]]
        tokens, probs = _children(logits, [g.item for g, _ in new], width, cluster)
        for r, (g, node) in enumerate(new):
            g.expand(node, tokens[r], probs[r])
    if size is None:
        out = []
        for g, it in zip(grow, items):
            tree, kept, path_probs = g.builder.build(it.nodes)
            chain = frozenset(i for i, v in enumerate(kept.tolist()) if v in g.on_chain)
            out.append(DraftTree(tree, float(np.sum(path_probs[1:])), chain))
        return out
    # Grown draft nodes are builder nodes 1..n-1; the root (0) is the parent -1.
    probs = [np.array([g.builder.path_prob(v) for v in range(1, len(g.builder))]) for g in grow]
    parents = [np.array([g.parent[v] - 1 for v in range(1, len(g.builder))], dtype=np.int32) for g in grow]
    out = []
    for g, it, (nodes, predicted) in zip(grow, items, size(items, probs, parents)):
        tree, index = TokenTree(g.token[0]), {0: 0}
        for v in nodes[:it.nodes]:  # most valuable first: parents before children
            node = v + 1
            index[node] = tree.add_node(index[g.parent[node]], g.token[node])
        out.append(DraftTree(tree, predicted, frozenset(i for v, i in index.items() if v in g.on_chain)))
    return out
