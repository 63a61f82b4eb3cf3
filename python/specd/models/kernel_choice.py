"""KernelChoice: which variant of specd's CUDA kernels a model's kernel paths take, where a
kernel has more than one (docs/cuda.md). The defaults are the variants validated and timed on
an H100; the others are opt-in until a GPU run validates and times them.

- ``grouped_attention``: the tree attention of the kernel-attention forwards (both graph
  runners, eager kernel-attention forwards) runs the split, head-grouped kernel
  (``cuda/tree_attention_grouped.h``: a block per query token, GQA group and KV split,
  partial softmax states merged) instead of one block per query token and head. Same rule,
  equal to float rounding.
- ``cluster_rows``: the row kernels run with a thread-block cluster of 8 blocks per row
  (sm_90+; ``RowSplit::kCluster``, cuda/row_split.h) instead of one block per row: as a
  draft model, its sampled rows (the draft graph and the plain draft loop); as a target,
  the sampled requests' verification (their sampling_probs rows and verify_stochastic, a
  cluster per request). Same rules and keys; sums fold in another fixed order (docs/cuda.md,
  the CPU equality caveat).

Neither has any effect on the CPU, where the ops run their float32 references.
"""

from __future__ import annotations

from dataclasses import dataclass

from specd.errors import InvalidArgumentError


@dataclass(frozen=True)
class KernelChoice:
    grouped_attention: bool = False
    cluster_rows: bool = False

    def __post_init__(self):
        for name in ("grouped_attention", "cluster_rows"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(f"KernelChoice.{name} must be a bool, got {getattr(self, name)!r}")


def kernels_of(model) -> KernelChoice:
    """A model's KernelChoice (LlamaModel.kernels; other model objects: the defaults)."""
    choice = getattr(model, "kernels", None)
    return choice if isinstance(choice, KernelChoice) else KernelChoice()
