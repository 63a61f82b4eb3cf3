"""Draft-model token trees (SpeculationConfig.draft_tree_width > 1): the draft grows a tree of
depth k per request, EAGLE-2 style, with the C++ DraftTreeBuilder
(cpp/include/specd/draft_tree_builder.h) keeping the nodes of highest path probability.

Per request, with width w and depth k:
- forward 0 is the chain's catch-up (model_runner.catch_up_segment); the root's w most
  probable children are the first frontier;
- forward j = 1..k-1 feeds the w most probable unexpanded nodes of the deepest depth
  (DraftTreeBuilder.frontier; the draft's greedy path, the chain a width of 1 would propose,
  always among them) and expands each into its w most probable children. Each fed node sees
  the history and its own ancestors: a mask over every node fed so far, whose K/V the
  earlier forwards wrote (AttentionMetadata.masks of width t, tree_attention.h's
  ``tree_lens``), so a forward costs w tokens, not every node fed so far. A node keeps its KV
  slot (the catch-up's, then one per fed node in feeding order), so the draft writes at most
  (k - 1) w slots past its catch-up;
- the tree verified is the item's `nodes` best nodes by path probability
  (DraftTreeBuilder.build) under a static k, or the nodes the policy's ``size_trees``
  picks from every grown node's path probability and parent (the goodput policy ranks
  them by its per-depth acceptance shared by the draft's confidence; goodput_controller.h).

"Probable" is the draft's distribution the request would sample from (temperature, top-k,
top-p, min-p; plain softmax, temperature 1, for greedy requests), by one
specd::sampling_probs call per forward for all rows, so candidates are deterministic: verify
them without draft rows (one-hot proposals), which is lossless for greedy and sampled
requests alike. After verification the draft keeps the catch-up's KV and the accepted path's
(DraftTree.fed_path: its fed nodes' K/V, moved by the engine next to the catch-up), as a
chain keeps its accepted drafts', so the next catch-up is one or two tokens. The draft's greedy chain is marked in each tree: the policy's
per-depth acceptance hears how far that chain was accepted (DraftTree.chain_result), so it
stays the acceptance of the chain that a width of 1 would propose.

This host loop reads each forward's candidates on the host (one sync per forward). On CUDA
its forwards attend with the tree-attention kernel, the tree masks as the kernel's tree_mask
rows (model_runner.forward). With a DraftTreeGraphRunner (draft_tree_graph.py; LLM's
``draft_graph``, on by default on CUDA) the same growth runs on the device, graph-capturable, with one host read
per call; _Growth.replay rebuilds the builder from its record, so the trees are the host loop's.
Candidates are ranked by ``tree_children`` in both.

A request whose candidates all have probability 0 at some depth (e.g. NaN logits) stops
growing there; its tree keeps what it has (the root alone when it happens at forward 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from specd._core import DraftTreeBuilder
from specd.engine.draft_sampling import pack_params, param_words
from specd.engine.model_runner import Segment, catch_up_segment, forward, segment_keys
from specd.engine.scheduler import DRAFT, WorkItem
from specd.kv_cache import KVCachePool
from specd.models.kernel_choice import kernels_of
from specd.ops import host_call, sampling_probs
from specd.models.llama import LlamaModel
from specd.verification import TokenTree


def tree_param_words(p) -> tuple[float, int, float, float]:
    """The packed SamplingParams words whose distribution ranks a request's tree candidates:
    its sampling rules, or for a greedy request the plain softmax (temperature 1, no cut)."""
    return (1.0, 0, 1.0, 0.0) if p.greedy else param_words(p)


def tree_children(logits: torch.Tensor, params: torch.Tensor, width: int,
                  cluster: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``width`` most probable next tokens of each logits row ``[rows, vocab]`` under its
    packed params ``[rows, 4]`` (tree_param_words; one ``specd::sampling_probs`` call, so a
    row the rules refuse, e.g. NaN logits, is zeros: no candidates) and their probabilities,
    best first: int64 and float32 ``[rows, min(width, vocab)]``, on the device (no host read;
    probability 0 marks no candidate). ``cluster``: that call's thread-block cluster per row.
    The host loop and the draft tree graph runner both rank candidates with it."""
    probs, _ = host_call(sampling_probs)(logits, params, cluster)  # (16-bit rows: as in float32)
    top = torch.topk(probs, min(width, logits.shape[-1]), dim=-1)
    return top.indices, top.values


def _children(logits: torch.Tensor, owners: list[WorkItem], width: int,
              cluster: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """tree_children of a forward's logits ``[rows, vocab]`` (row r belongs to ``owners[r]``),
    read to the host in one copy: int32 and float32 ``[rows, width]``."""
    params = pack_params([it.request.params for it in owners], logits.device, tree_param_words)
    tokens, probs = tree_children(logits, params, width, cluster)
    packed = torch.cat([tokens.double(), probs.double()], dim=-1).cpu().numpy()  # the forward's one host read
    w = tokens.shape[-1]
    return packed[:, :w].astype(np.int32), packed[:, w:].astype(np.float32)


class _Growth:
    """One request's tree under construction: the builder and the nodes fed to the draft."""

    def __init__(self, item: WorkItem, width: int, windowed: bool):
        self.item, self.width, self.windowed = item, width, windowed
        self.builder = DraftTreeBuilder(item.request.tokens[-1])
        self.fed: list[int] = []    # builder nodes fed to the draft, in slot order
        # Per builder node (ids are 0, 1, 2, ... in the order added): parent (-1: the root's),
        # depth and token.
        self.parent: list[int] = [-1]
        self.depth: list[int] = [0]
        self.token: list[int] = [item.request.tokens[-1]]
        self.chain = 0  # the deepest node of the draft's greedy path (most probable child each time)
        self.on_chain = {0}  # every node of that path
        self.slot: dict[int, int] = {}  # fed node -> its draft KV slot past the catch-up (item.draft_slots)

    def expand(self, node: int, tokens: np.ndarray, probs: np.ndarray) -> None:
        """Adds the candidates (one row of _children) of an unexpanded node."""
        keep = probs > 0
        tokens, probs = tokens[keep], probs[keep]
        first = len(self.builder)
        self.builder.expand(node, tokens, probs)
        n = len(tokens)
        if node == self.chain and n:
            self.chain = first  # its most probable child (top-w comes sorted)
            self.on_chain.add(first)
        self.parent.extend([node] * n)
        self.depth.extend([self.depth[node] + 1] * n)
        self.token.extend(tokens.tolist())

    def path(self, node: int) -> list[int]:
        """The tokens from the root's child down to builder ``node`` (its drafts, in order)."""
        out = []
        while node != 0:
            out.append(self.token[node])
            node = self.parent[node]
        return out[::-1]

    def fed_slots(self, nodes: list[int]) -> np.ndarray:
        """int64 draft KV slots (past the catch-up) of builder ``nodes``, -1 for those never fed."""
        return np.array([self.slot.get(v, -1) for v in nodes], dtype=np.int64)

    def next_frontier(self, depth: int) -> list[int]:
        """The nodes forward ``depth`` feeds: the ``width`` most probable candidates at that
        depth (DraftTreeBuilder.frontier), the draft's greedy chain forced in as the last one
        when it is not among them. Empty when no candidate reached that depth (every
        candidate of the forward before had probability 0): the tree stops growing."""
        frontier = [int(n) for n in self.builder.frontier(self.width)]
        if not frontier or self.depth[frontier[0]] != depth:
            return []
        if self.chain not in frontier and self.depth[self.chain] == depth:  # always grown (rules above)
            frontier[-1] = self.chain
        return frontier

    def segment(self, frontier: list[int]) -> Segment:
        """The next forward's segment: the new ``frontier`` nodes alone (one logits row each),
        under a mask over every node fed so far (the tree's part of the extent: the earlier
        nodes' K/V is in the cache from the forwards that fed them)."""
        self.slot.update((node, len(self.fed) + i) for i, node in enumerate(frontier))
        self.fed.extend(frontier)
        req, item = self.item.request, self.item
        n, w = len(self.fed), len(frontier)
        mask = torch.zeros(w, n, dtype=torch.bool)
        for i, node in enumerate(frontier):
            while node != 0:
                mask[i, self.slot[node]] = True  # its slot is its index among the fed nodes
                node = self.parent[node]
        positions = [req.length - 1 + self.depth[node] for node in frontier]
        slots = item.draft_slots[item.draft_catch_up + n - w:item.draft_catch_up + n]
        keys = None
        if self.windowed:  # every key's logical position: the history, then the fed nodes
            keys = torch.tensor(list(range(req.length)) + [req.length - 1 + self.depth[v] for v in self.fed],
                                dtype=torch.int64)
        return Segment(req.id, torch.tensor([self.token[v] for v in frontier], dtype=torch.int64),
                       torch.tensor(positions, dtype=torch.int64), slots, req.length + n, mask, key_positions=keys,
                       logits_from=0)

    def replay(self, record: np.ndarray) -> None:
        """Grows the tree from a draft tree graph runner's record of this request, float64
        ``[>= k, 2 w w + w]`` (draft_tree_graph.py: per forward j, the candidates of the nodes it
        fed, ``[w, w]`` tokens then probabilities, row 0 the root's; then ``[w]`` the nodes
        forward j fed, as flat indices into forward j - 1's candidates, -1 none): the same
        expansions in the same order as the host loop, so the same builder nodes, made in C++
        (DraftTreeBuilder.replay, draft_tree_builder.h). ``fed`` stays empty (the host loop's);
        ``slot`` gets the runner's KV layout (forward j's frontier position f at (j - 1) w + f)."""
        k = self.item.k
        chain, fed = self.builder.replay(np.ascontiguousarray(record[:k]).reshape(-1), k, self.width)
        self.slot = {int(node): i for i, node in enumerate(fed.tolist()) if node >= 0}
        parents, depths, tokens, _ = self.builder.nodes()
        self.parent, self.depth, self.token = parents.tolist(), depths.tolist(), tokens.tolist()
        self.chain = int(chain[-1])
        self.on_chain = set(chain.tolist())


@dataclass
class DraftTree:
    """A draft tree to verify, what it predicts, which of its nodes are the draft's greedy
    chain (the root and the most probable child of each chain node; the engine reports the
    chain's part to the policy's per-depth acceptance), and where the draft wrote each node's
    K/V."""

    tree: TokenTree
    predicted: float        # summed path probability of its drafts, or what size_trees said
    chain: frozenset[int]   # tree node indices on the draft's greedy path (the root included)
    fed: np.ndarray         # int64 [len(tree)]: each node's draft KV slot past the catch-up, -1 if never fed

    def fed_path(self, path: np.ndarray) -> np.ndarray:
        """The draft KV slots (past the catch-up) of an accepted root-to-node ``path``'s drafts
        whose K/V the draft wrote: ``path[1:]`` up to its first node never fed (only the last
        accepted node can be one: every other has children, so it was fed; depth-k nodes
        never are). Moved to the slots right after the catch-up, they are the next step's
        draft history, as a chain's accepted drafts are."""
        slots = self.fed[np.asarray(path[1:], dtype=np.int64)]
        missing = np.flatnonzero(slots < 0)
        return slots[:missing[0]] if len(missing) else slots

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
                   graph=None, grammar=None) -> list[DraftTree]:
    """The draft trees of ``items`` (each k > 0), in item order (rules above).
    ``size(items, path_probs, parents)``, when given (the policy's size_trees), gets every
    grown node's path probability and parent (-1: the root) and returns per tree the nodes
    to verify, parents first, and their predicted accepted drafts; otherwise the item.nodes
    nodes of highest path probability are verified. ``on_forward(tokens, run, keys)``, when
    given, wraps each forward (the engine times them; keys: model_runner.segment_keys).

    ``graph``: a DraftTreeGraphRunner (engine/draft_tree_graph.py) that grows the trees on the
    device over fixed-shape buffers (CUDA graph replays on GPUs, one host read per call); the
    engine passes its runner when ``LLM(..., draft_graph=...)`` is on. Batches it does not
    accept (another model, pool or width; k or batch size past its buffers) grow here, with
    one host read per forward.

    ``grammar``: a grammar_drafts.DraftGrammar that masks the rows of requests with
    structured outputs to what their grammar allows after each fed node's path, so their
    candidates are tokens the grammar allows; a call with such a request grows here."""
    constrained = [it.request.params.structured_outputs is not None for it in items] if grammar is not None else []
    if any(constrained):
        graph = None
    def run(segments: list[Segment]) -> torch.Tensor:
        tokens = sum(len(seg.input_ids) for seg in segments)
        call = lambda: forward(model, pool, DRAFT, segments)  # noqa: E731
        return on_forward(tokens, call, segment_keys(segments)) if on_forward is not None else call()

    if (graph is not None and graph.model is model and graph.pool is pool and graph.width == width
            and graph.accepts(items)):
        first = None
        if graph.catch_up_width(items) is None:  # a catch-up wider than its buffers: forward 0 here
            first = run([catch_up_segment(it) for it in items])
        record = graph.run(items, first, on_forward).cpu().numpy()  # [k, n, record]: the call's one host read
        grow = [_Growth(it, width, False) for it in items]
        for i, g in enumerate(grow):
            g.replay(record[:, i])
        return _trees(grow, items, size)
    grow = [_Growth(it, width, model.window is not None) for it in items]
    logits = run([catch_up_segment(it) for it in items])  # [n, vocab]: each root's next token
    if any(constrained):
        grammar.mask(logits, [(i, it.request, ()) for i, it in enumerate(items) if constrained[i]])
    cluster = kernels_of(model).cluster_rows
    tokens, probs = _children(logits, items, width, cluster)
    for i, g in enumerate(grow):
        g.expand(0, tokens[i], probs[i])
    for j in range(1, max(it.k for it in items)):
        fronts = [(g, g.next_frontier(j)) for g in grow if g.item.k > j]
        active = [g for g, front in fronts if front]
        if not active:
            break
        logits = run([g.segment(front) for g, front in fronts if front])
        new = [(g, node) for g, front in fronts for node in front]
        if any(constrained):
            grammar.mask(logits, [(r, g.item.request, g.path(node)) for r, (g, node) in enumerate(new)
                                  if g.item.request.params.structured_outputs is not None])
        tokens, probs = _children(logits, [g.item for g, _ in new], width, cluster)
        for r, (g, node) in enumerate(new):
            g.expand(node, tokens[r], probs[r])
    return _trees(grow, items, size)


def _trees(grow: list[_Growth], items: list[WorkItem], size) -> list[DraftTree]:
    """The trees to verify from the grown builders (run_draft_tree's rules)."""
    if size is None:
        out = []
        for g, it in zip(grow, items):
            tree, kept, path_probs = g.builder.build(it.nodes)
            chain = frozenset(i for i, v in enumerate(kept.tolist()) if v in g.on_chain)
            out.append(DraftTree(tree, float(np.sum(path_probs[1:])), chain, g.fed_slots(kept.tolist())))
        return out
    # Grown draft nodes are builder nodes 1..n-1; the root (0) is the parent -1.
    probs = [g.builder.nodes()[3][1:] for g in grow]
    parents = [np.array(g.parent[1:], dtype=np.int32) - 1 for g in grow]
    out = []
    for g, it, (nodes, predicted) in zip(grow, items, size(items, probs, parents)):
        tree, index = TokenTree(g.token[0]), {0: 0}
        for v in nodes[:it.nodes]:  # most valuable first: parents before children
            node = v + 1
            index[node] = tree.add_node(index[g.parent[node]], g.token[node])
        out.append(DraftTree(tree, predicted, frozenset(i for v, i in index.items() if v in g.on_chain),
                             g.fed_slots(list(index))))  # index: builder nodes in tree node order
    return out
