"""Model-free draft proposers, implemented in C++ (``cpp/include/specd/proposer.h``).

- :class:`NgramProposer`: prompt lookup. The longest suffix n-gram (``n_max`` down to
  ``n_min``) that occurred earlier in the request's history proposes what followed it; up
  to ``max_candidates`` distinct continuations (``order="recent"`` or ``"frequent"``) are
  merged into a token tree.
- :class:`SuffixProposer`: SuffixDecoding-style. Suffix automata over the request's history
  and over a bounded global cache of finished requests' outputs (oldest evicted first)
  propose the tree of most frequent continuations under a node budget.

Both keep an index per request that grows with each append (no rescans), and propose for a
whole batch in one call. The proposal for a request costs the same whatever its history
length.
"""

from specd._core import NgramProposer, Proposals, Proposer, SuffixProposer

__all__ = ["Proposer", "NgramProposer", "SuffixProposer", "Proposals"]
