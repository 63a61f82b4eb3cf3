"""KernelChoice: which variant of specd's CUDA kernels a model's kernel paths take, where a
kernel has more than one (docs/cuda.md). The defaults follow what the H100 measured
(docs/benchmarks.md, "Fifth GPU session"); both variants of each kernel are validated there.

- ``grouped_attention``: the tree attention of the kernel-attention forwards (both graph
  runners, eager kernel-attention forwards) by the split, head-grouped kernel
  (``cuda/tree_attention_grouped.h``: a block per query token, GQA group and KV split,
  partial softmax states merged) instead of one block per query token and head. Same rule,
  equal to float rounding. ``"auto"`` (default, ``grouped_for``): the grouped kernel for
  forwards of at least ``GROUPED_ATTENTION_MIN_TOKENS`` query tokens (prefill chunks, wide
  verify batches), where the H100 measured it 1.1-2x faster over a whole forward, and for
  forwards of at least ``GROUPED_ATTENTION_MIN_TREE_TOKENS`` tokens with
  ``GROUPED_ATTENTION_MIN_QUERY`` or more per sequence on average (verify steps of k >= 4 at
  batch >= 13, prefill chunks of 64-511 tokens: 1.00-1.11x there); the per-head kernel otherwise (small decode batches, where it was
  up to 1.2x faster). ``True`` / ``False``: always / never.
- ``cluster_rows``: the row kernels run with a thread-block cluster of 8 blocks per row
  (sm_90+; ``RowSplit::kCluster``, cuda/row_split.h; one block per row on older GPUs)
  instead of one block per row: as a draft model, its sampled rows (the draft graph and the
  plain draft loop); as a target, the sampled requests' verification (their sampling_probs
  rows and verify_stochastic, a cluster per request). Same rules and keys; sums fold in
  another fixed order (docs/cuda.md, the CPU equality caveat). Default on: 1.2-2.8x faster
  for sampled rows and 3x for stochastic verification on the H100.

- ``draw``: how sampled tokens that come from one row are drawn. As a draft model: its
  sampled draft tokens (``specd.ops.sample_tokens_and_probs``, whose probability rows
  verification checks them against). As a target: the token of a sampled request's step
  without drafts (k = 0: plain decoding, or the controller speculating nothing); the bonus
  and recovered tokens of verification keep the verifier's draw. ``"inverse_cdf"``
  (default): the inverse-CDF draw (for the target, stochastic verification of the root-only
  tree: the probability row, then the verifier's draw). ``"gumbel"``: the Gumbel-max rule
  (``DrawRule::kGumbelMax``, sampling_batch.h): the same distribution, other tokens for the
  same seed; as a target, one ``specd.ops.sample_tokens`` call without probability rows,
  one pass over a row without a top-k/top-p/min-p cut (1.1-1.5x faster on the CPU,
  bench/root_sampling.py); as a draft, no sum and no second pass over the written row. Not
  yet timed on a GPU, so not the default.

``grouped_attention`` and ``cluster_rows`` have no effect on the CPU, where the ops run their
float32 references; ``draw`` changes seeded tokens everywhere (never the distribution).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from specd.errors import InvalidArgumentError

# Query tokens per forward from which "auto" takes the grouped attention kernel (H100,
# random-weight models of the Qwen2.5-Coder pair's shapes, context 256: the grouped kernel
# won every forward of >= 512 tokens, 1.09-1.97x, and lost 0.82-0.98x on most below 64).
GROUPED_ATTENTION_MIN_TOKENS = 512
# ... and below that, for forwards of >= 64 tokens averaging >= 5 per sequence (the same
# profile: target 8 x 9, 16 x 5, 32 x 9, 64 x 5 tokens 1.04-1.08x, draft 16 x 5 to 64 x 5
# 1.02-1.11x, 16 x 9 and 32 x 5 even; under 64 tokens the draft's 8 x 5 lost, 0.94x).
GROUPED_ATTENTION_MIN_TREE_TOKENS = 64
GROUPED_ATTENTION_MIN_QUERY = 5
DRAWS = ("inverse_cdf", "gumbel")


@dataclass(frozen=True)
class KernelChoice:
    grouped_attention: Union[bool, str] = "auto"
    cluster_rows: bool = True
    draw: str = "inverse_cdf"

    def __post_init__(self):
        if not (isinstance(self.grouped_attention, bool) or self.grouped_attention == "auto"):
            raise InvalidArgumentError(
                f"KernelChoice.grouped_attention must be a bool or 'auto', got {self.grouped_attention!r}")
        if not isinstance(self.cluster_rows, bool):
            raise InvalidArgumentError(f"KernelChoice.cluster_rows must be a bool, got {self.cluster_rows!r}")
        if self.draw not in DRAWS:
            raise InvalidArgumentError(
                f"KernelChoice.draw must be one of {', '.join(map(repr, DRAWS))}, got {self.draw!r}")


def grouped_for(grouped_attention: Union[bool, str], tokens: int, sequences: int = 0) -> bool:
    """Whether a forward of ``tokens`` query tokens over ``sequences`` sequences (0: not
    known) takes the grouped attention kernel under a KernelChoice.grouped_attention setting
    (True, False or "auto")."""
    if grouped_attention == "auto":
        if tokens >= GROUPED_ATTENTION_MIN_TOKENS:
            return True
        return (sequences > 0 and tokens >= GROUPED_ATTENTION_MIN_TREE_TOKENS
                and tokens >= GROUPED_ATTENTION_MIN_QUERY * sequences)
    return bool(grouped_attention)


def kernels_of(model) -> KernelChoice:
    """A model's KernelChoice (LlamaModel.kernels; other model objects: the defaults)."""
    choice = getattr(model, "kernels", None)
    return choice if isinstance(choice, KernelChoice) else KernelChoice()
