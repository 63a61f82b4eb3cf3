"""Draft-model token trees (SpeculationConfig.draft_tree_width > 1): the draft grows a tree of
depth k per request, EAGLE-2 style, with the C++ DraftTreeBuilder
(cpp/include/specd/draft_tree_builder.h) keeping the nodes of highest path probability.

Per request, with width w and depth k:
- forward 0 is the chain's catch-up (model_runner.catch_up_segment); the root's w most
  probable children are the first frontier;
- forward j = 1..k-1 feeds every node fed so far plus the w most probable unexpanded nodes of
  the deepest depth (DraftTreeBuilder.frontier), under a tree mask (each node sees the
  history and its own ancestors), and expands each new node into its w most probable
  children. Re-feeding earlier nodes keeps the mask within the forward's new tokens, which is
  what the attention takes; a node keeps its KV slot (the catch-up's, then one per fed node
  in feeding order), so the draft writes at most (k - 1) w slots past its catch-up;
- the tree verified is the `nodes` best nodes by path probability (DraftTreeBuilder.build).

"Probable" is the draft's distribution the request would sample from (temperature, top-k,
top-p, min-p; plain softmax for greedy requests), so candidates are deterministic: verify
them without draft rows (one-hot proposals), which is lossless for greedy and sampled
requests alike. Only the catch-up's draft KV is kept; the accepted tokens are fed again as
the next step's catch-up.

The tree loop reads each forward's candidates on the host (one sync per forward), and is not
run by the CUDA-graph draft runner, which captures chains.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from specd._core import DraftTreeBuilder
from specd.engine.model_runner import Segment, catch_up_segment, forward
from specd.engine.scheduler import DRAFT, WorkItem
from specd.engine.torch_sampling import sampling_probs
from specd.kv_cache import KVCachePool
from specd.models.llama import LlamaModel
from specd.verification import TokenTree


def _children(logits: torch.Tensor, item: WorkItem, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The `width` most probable next tokens of one row and their probabilities (positive only)."""
    params = item.request.params
    probs = torch.softmax(logits.double(), dim=-1) if params.greedy else sampling_probs(logits, params)
    top = torch.topk(probs, min(width, probs.shape[-1]))
    keep = top.values > 0
    return (top.indices[keep].to(torch.int32).cpu().numpy(), top.values[keep].to(torch.float32).cpu().numpy())


class _Growth:
    """One request's tree under construction: the builder and the nodes fed to the draft."""

    def __init__(self, item: WorkItem, width: int, windowed: bool):
        self.item, self.width, self.windowed = item, width, windowed
        self.builder = DraftTreeBuilder(item.request.tokens[-1])
        self.fed: list[int] = []    # builder nodes fed to the draft, in slot order
        self.parent: dict[int, int] = {}
        self.depth: dict[int, int] = {0: 0}
        self.token: dict[int, int] = {0: item.request.tokens[-1]}

    def expand(self, node: int, logits: torch.Tensor) -> None:
        tokens, probs = _children(logits, self.item, self.width)
        first = len(self.builder)
        self.builder.expand(node, tokens, probs)
        for child, token in zip(range(first, len(self.builder)), tokens.tolist()):
            self.parent[child] = node
            self.depth[child] = self.depth[node] + 1
            self.token[child] = token

    def segment(self) -> tuple[Segment, int]:
        """The next forward's segment (every fed node plus the new frontier) and how many
        frontier nodes it adds (their logits are its last rows)."""
        frontier = [int(n) for n in self.builder.frontier(self.width)]
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


def run_draft_tree(model: LlamaModel, pool: KVCachePool, items: list[WorkItem], width: int,
                   on_forward: Optional[Callable[[int, Callable[[], torch.Tensor]], torch.Tensor]] = None,
                   ) -> list[TokenTree]:
    """The draft trees of ``items`` (each k > 0, ``nodes`` verified), in item order (rules above).
    ``on_forward(tokens, run)``, when given, wraps each forward (the engine times them)."""
    grow = [_Growth(it, width, model.window is not None) for it in items]

    def run(segments: list[Segment]) -> torch.Tensor:
        tokens = sum(len(seg.input_ids) for seg in segments)
        call = lambda: forward(model, pool, DRAFT, segments)  # noqa: E731
        return on_forward(tokens, call) if on_forward is not None else call()

    logits = run([catch_up_segment(it) for it in items])  # [n, vocab]: each root's next token
    for g, row in zip(grow, logits):
        g.expand(0, row)
    for j in range(1, max(it.k for it in items)):
        active = [g for g in grow if g.item.k > j]
        planned = [g.segment() for g in active]
        logits = run([seg for seg, _ in planned])
        row = 0
        for g, (_, added) in zip(active, planned):
            for node in g.fed[len(g.fed) - added:]:
                g.expand(node, logits[row])
                row += 1
    return [g.builder.build(g.item.nodes)[0] for g in grow]
