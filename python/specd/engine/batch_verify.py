"""What a step's verification reads from the target's logits, gathered for all deciding
requests at once so that the host waits for the device as few times as possible.

- Greedy requests: the argmax of every logits row and whether the row's largest logit is
  finite; each request then follows its tree on the host
  (:func:`specd.verification.verify_greedy_tokens`).
- Sampled requests: verified where the logits are, in batched ops (by default, for a group
  with drafts, ``specd::verify_stochastic_logits``: the target's distribution of a node is
  planned from its logits row inside the walk, only for the nodes the walk visits; for a
  group of root-only trees, or with ``from_logits=False``, ``specd::sampling_probs`` writes
  every node's probability row first, then ``specd::verify_stochastic`` reads them; the same
  results; rules in
  cpp/include/specd/sampling_batch.h and verify_batch.h; CUDA kernels on a GPU, the C++
  references on the CPU), so no ``[rows, vocab]`` row reaches the host: only the accepted
  tokens, paths and counts come back. Requests whose drafts came from the draft model (with
  their distributions) and model-free ones (one-hot drafts) are two groups, one op call each
  (two on the rows path). With
  ``KernelChoice.draw = "gumbel"``, requests without drafts (a root-only tree: k = 0)
  are a third group: one ``specd::sample_tokens`` call with the Gumbel-max draw, no
  probability rows. (By default they stay in the second group: ``sample_tokens``' own
  inverse-CDF draw gives the same token but recomputes the exponentials in each of its
  passes, and measured 0.7-0.8x the time of the probability rows plus verification on the
  CPU for rows without a cut, bench/root_sampling.py.)
  Nothing is copied into node order: the target rows are a view of the logits when the
  group's spans follow one another (from the logits, otherwise found through a row index;
  the rows path gathers them), and the draft rows stay where the draft wrote them
  (the ops' draft_index). The draft rows' totals come with them (from the draft graph
  runner; without from_logits the target's too, from ``sampling_probs``), so verification
  reads a draft row whole only where a rejection or the final draw needs it, not at every
  accepted node.

Every group's device work is queued first and all results come back in ONE device-to-host
copy (with the draft model's chains when they are still on the device,
model_runner.DeviceDrafts): the host waits for the GPU once per step, and the GPU runs the
verify forward and the groups' kernels back to back.

A request whose rows hold a NaN or +inf logit, or no finite one (or whose sampling parameters
the ops reject) gets ``VerifyInputs.error``, a message naming it, instead of a result; the
engine fails that request alone (finish_reason "error") and the others go on. (A sampled
request verified from the logits is checked on the rows its walk reads, the nodes it visits,
as greedy verification is by ``verify_greedy``; with from_logits=False on all its rows.)

The results equal the per-request CPU path (``_core.sampling_probs`` then
:func:`specd.verification.verify`, key (seed, request, step 0, position = the request's
length)): tests/python/test_ops.py checks the batched ops against those references.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np
import torch

from specd import _core
from specd.engine.draft_sampling import pack_words, signed64
from specd.engine.scheduler import WorkItem
from specd.errors import InvalidArgumentError
from specd.ops import host_call, sample_tokens, sampling_probs, verify_stochastic, verify_stochastic_logits
from specd.uploads import to_device
from specd.verification import TokenTree, VerifyOutput

_WORD = 0xFFFFFFFF


@dataclass
class VerifyInputs:
    """One request's verification input: for a greedy request its nodes' target argmax
    ``[len(tree)]`` (followed on the host); for a sampled one the finished verification."""

    argmax: Optional[np.ndarray] = None
    result: Optional[VerifyOutput] = None
    error: Optional[str] = None  # set instead of the above when this request's verification failed

    def verify(self, tree: TokenTree) -> VerifyOutput:
        if self.error is not None:
            raise InvalidArgumentError(self.error)
        if self.result is not None:
            return self.result
        # verify_greedy_tokens without its argument conversions: argmax is already a
        # contiguous int32 slice of the step's host copy (verify_inputs)
        return VerifyOutput(*_core.verify_greedy_tokens(tree, self.argmax))


def verify_inputs(deciding: list[WorkItem], trees: dict[int, TokenTree], logits: torch.Tensor,
                  draft_dists: dict[int, torch.Tensor], cluster: bool = False,
                  gumbel: bool = False, drafts=None, from_logits: bool = True) -> dict[int, VerifyInputs]:
    """Every deciding item's VerifyInputs, its rows taken in item order from ``logits``
    ``[sum of tree sizes, vocab]``; ``draft_dists``: request id -> the draft's distributions
    float32 for sampled draft-model chains, ``[m, vocab]``: the rows of the tree's first m
    nodes (m = k for a chain: its leaf has no row), views of one buffer where possible
    (``_draft_rows``). ``cluster``: the sampling
    and stochastic verification kernels with a thread-block cluster per row / request
    (KernelChoice.cluster_rows of the target). ``gumbel``: sampled requests without drafts
    draw by the Gumbel-max rule (KernelChoice.draw). ``from_logits``: sampled requests are
    verified from the logits (``verify_stochastic_logits``), else from probability rows
    (module docstring).

    Every group's device work is queued first (the greedy rows' argmax, the sampled groups'
    uploads and kernels), then everything is read back in ONE copy: the host waits once, and
    the GPU runs the groups back to back. ``drafts`` (model_runner.DeviceDrafts): the draft
    chains of some items are still on the device and their trees hold placeholder tokens;
    the sampled group's node tokens get them on the device, and they are read in the same
    copy (``drafts.to_host()`` then returns them without another copy)."""
    spans, row = [], 0
    for it in deciding:
        spans.append((row, row + len(trees[it.request.id])))
        row = spans[-1][1]
    out = {it.request.id: VerifyInputs() for it in deciding}
    greedy = any(it.request.params.greedy for it in deciding)
    queued: list[tuple[list, _Queued]] = []
    greedy_rows = _queue_greedy_rows(logits) if greedy else None
    sampled = [(it, span) for it, span in zip(deciding, spans) if not it.request.params.greedy]
    roots = [(it, span) for it, span in sampled if span[1] - span[0] == 1] if gumbel else []
    if roots:
        queued.append((roots, _queue_roots(roots, logits, cluster, gumbel)))
        sampled = [(it, span) for it, span in sampled if span[1] - span[0] > 1]
    for drafted in (True, False):
        group = [(it, span) for it, span in sampled if (it.request.id in draft_dists) == drafted]
        if group:
            queued.append((group, _queue_sampled(group, trees, logits, draft_dists if drafted else None, cluster,
                                                 drafts if drafted else None, from_logits)))
    host = _read([q for _, q in queued] + ([_Queued(greedy_rows, None)] if greedy_rows is not None else []), drafts)
    if greedy:
        if greedy_rows is not None:
            rows = host[-1]
            argmax, finite = rows[:len(rows) // 2], rows[len(rows) // 2:].astype(bool)
        else:
            argmax, finite = _greedy_rows_in_place(logits)
        argmax = argmax.astype(np.int32)  # what verify_greedy_tokens reads: slices need no copy
        for it, (a, b) in zip(deciding, spans):
            if not it.request.params.greedy:
                continue
            if finite[a:b].all():
                out[it.request.id].argmax = argmax[a:b]
            else:
                out[it.request.id].error = (f"request {it.request.id}: verification failed: the target's logits "
                                            f"rows {[int(r) for r in np.flatnonzero(finite[a:b] == 0)]} of its "
                                            "tree hold NaN or +inf, or no finite value")
    for (group, q), part in zip(queued, host):
        for (it, _), result in zip(group, q.finish(part)):
            if isinstance(result, str):
                out[it.request.id].error = result
            else:
                out[it.request.id].result = result
    return out


@dataclass
class _Queued:
    """A group's results queued on the device and not read yet: ``device`` (an integer tensor)
    and ``finish``, which turns its host copy (int64 numpy) into the group's results."""

    device: torch.Tensor
    finish: Optional[Callable[[np.ndarray], list]]


def _read(queued: list[_Queued], drafts=None) -> list[np.ndarray]:
    """The queued tensors' host copies (int64 numpy, in order), read in one device -> host
    copy, with ``drafts``' tokens when given (model_runner.DeviceDrafts.read keeps them)."""
    if not queued and drafts is None:
        return []
    flat = torch.cat([q.device.reshape(-1) for q in queued]) if queued else None  # (int64 each)
    if drafts is not None:
        _, host = drafts.read(flat)
    else:
        host = flat.cpu()  # the one wait
    host = host.numpy() if host is not None else np.zeros(0, dtype=np.int64)
    return np.split(host, np.cumsum([q.device.numel() for q in queued])[:-1]) if queued else []


def _queue_greedy_rows(logits: torch.Tensor) -> Optional[torch.Tensor]:
    """Every row's argmax and whether its value is finite, queued on the logits' device: int64
    ``[2 rows]`` (argmaxes, then 0/1). A NaN counts as the largest value (torch.argmax's
    rule), so a row holding one is not finite either. None for CPU float32 rows: numpy reads
    them in place (``_greedy_rows_in_place``)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return None
    # torch.max's indices follow torch.argmax's rules (the lowest id among ties, a NaN's id: one
    # comparator for both), and its values are the rows' largest: three kernels (max, isfinite,
    # the copy into the output) where argmax, gather, isfinite, a cast and a cat made five.
    rows = logits.shape[0]
    out = torch.empty(2 * rows, dtype=torch.int64, device=logits.device)
    values = torch.empty(rows, dtype=logits.dtype, device=logits.device)
    torch.max(logits.detach(), dim=-1, out=(values, out[:rows]))  # (out= takes no autograd input)
    out[rows:].copy_(torch.isfinite(values))
    return out


def _greedy_rows_in_place(logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """_queue_greedy_rows' result for CPU float32 rows, read in place by numpy."""
    rows = logits.detach().numpy()
    argmax = rows.argmax(-1)
    return argmax, np.isfinite(rows[np.arange(len(rows)), argmax])


def _sampling_words(reqs: list, sizes: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The requests' packed SamplingParams (each request's repeated over its ``sizes`` rows;
    sizes of 1: one per request) and RngKeys (key (seed, request, step 0, position = the
    request's length)), on ``device`` in one host-to-device copy (draft_sampling.pack_words)."""
    params = [(r.params.temperature, r.params.top_k, r.params.top_p, r.params.min_p) for r in reqs]
    keys = [(signed64(r.rng_seed), int(r.rng_request) & _WORD, int(r.length) & _WORD) for r in reqs]
    return pack_words(params, keys, device, sizes.tolist())


def _sample_roots(group: list[tuple[WorkItem, tuple[int, int]]], logits: torch.Tensor, cluster: bool,
                  gumbel: bool) -> list[Union[VerifyOutput, str]]:
    """Sampled requests without drafts (root-only trees): one token each from its row by
    ``specd::sample_tokens``, without writing a probability row: by the Gumbel-max rule
    (``gumbel``), or by its inverse-CDF draw, the one stochastic verification of a root-only
    tree makes (sampling_batch.h: the verifier's final draw, the same key; the engine uses this
    form only in bench/root_sampling.py). One copy back."""
    q = _queue_roots(group, logits, cluster, gumbel)
    return q.finish(_read([q])[0])


def _queue_roots(group: list[tuple[WorkItem, tuple[int, int]]], logits: torch.Tensor, cluster: bool,
                 gumbel: bool) -> _Queued:
    """_sample_roots' device work, queued (see _Queued)."""
    reqs = [it.request for it, _ in group]
    params, keys = _sampling_words(reqs, np.ones(len(reqs), dtype=np.int64), logits.device)
    index = [a for _, (a, _) in group]
    rows = (logits[index[0]:index[0] + 1] if len(index) == 1
            else logits.index_select(0, to_device(torch.tensor(index, dtype=torch.int64), logits.device)))
    tokens, status = host_call(sample_tokens)(rows, params, keys, cluster, gumbel)

    def finish(host: np.ndarray) -> list[Union[VerifyOutput, str]]:
        results = []
        for i, r in enumerate(reqs):
            if host[len(reqs) + i]:
                results.append(f"request {r.id}: verification failed (sampling status {int(host[len(reqs) + i])}): "
                               "non-finite logits or invalid sampling parameters")
            else:
                results.append(VerifyOutput(host[i:i + 1].copy(), np.zeros(1, dtype=host.dtype), 0))
        return results

    return _Queued(torch.cat([tokens, status]).to(torch.int64), finish)


def _verify_sampled(group: list[tuple[WorkItem, tuple[int, int]]], trees: dict[int, TokenTree],
                    logits: torch.Tensor, draft_dists: Optional[dict[int, torch.Tensor]],
                    cluster: bool = False, from_logits: bool = True) -> list[Union[VerifyOutput, str]]:
    """Sampled requests' verifications on ``logits``' device: two host-to-device copies (the
    trees; the parameters and keys), one device-to-host copy (the results, the only wait).
    A request whose verification failed gets an error message instead of a VerifyOutput."""
    q = _queue_sampled(group, trees, logits, draft_dists, cluster, from_logits=from_logits)
    return q.finish(_read([q])[0])


def _queue_sampled(group: list[tuple[WorkItem, tuple[int, int]]], trees: dict[int, TokenTree],
                   logits: torch.Tensor, draft_dists: Optional[dict[int, torch.Tensor]],
                   cluster: bool = False, drafts=None, from_logits: bool = True) -> _Queued:
    """_verify_sampled's device work, queued (see _Queued). ``drafts``: device-resident chains
    (model_runner.DeviceDrafts) whose trees hold placeholders: their tokens are put into the
    uploaded node tokens on the device. ``from_logits``: verify_inputs'."""
    device = logits.device
    reqs = [it.request for it, _ in group]
    tree_list = [trees[r.id] for r in reqs]
    sizes = np.array([len(t) for t in tree_list], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    nodes = int(offsets[-1])
    dest, src = _draft_positions(reqs, offsets, drafts)
    draft, draft_totals, draft_index = None, None, np.zeros(0, dtype=np.int32)
    if draft_dists is not None:
        if drafts is not None and drafts.probs is not None and len(dest) == nodes - len(reqs):
            # Every chain of the group is in the draft runner's buffers: its rows and their
            # totals are read there. Node v < k of a chain takes draft v + 1's distribution,
            # the one its token (at node v + 1, src = j n + column) was drawn from.
            draft, draft_totals, row_stride = drafts.rows()
            n_cols = len(drafts.items)
            draft_index = np.full(nodes, -1, dtype=np.int32)
            draft_index[dest - 1] = src // n_cols * row_stride + src % n_cols
        else:
            draft, draft_index = _draft_rows([draft_dists[r.id] for r in reqs], offsets)
    n = len(reqs)
    spans = [span for _, span in group]
    # A group of root-only trees (k = 0) visits every row it has: planning them in the walk
    # saves nothing and recomputes the exponentials of the draw's passes (0.52-0.57x on the
    # CPU for 1-64 rows at temperature 0.8, docs/benchmarks.md): those take the rows.
    use_logits = from_logits and nodes > n
    # From the logits, rows of spans apart are found through a row index (nothing gathered).
    row_index = (np.concatenate([np.arange(a, b) for a, b in spans]) if use_logits and not _contiguous(spans)
                 else np.zeros(0, dtype=np.int32))
    csr = to_device(torch.from_numpy(np.concatenate([offsets] + [t.parents for t in tree_list]
                                                     + [t.tokens for t in tree_list]
                                                     + [draft_index, row_index, dest, src]).astype(np.int32)), device)
    node_offsets, parents, tokens = csr[:n + 1], csr[n + 1:n + 1 + nodes], csr[n + 1 + nodes:n + 1 + 2 * nodes]
    at = n + 1 + 2 * nodes
    index = csr[at:at + nodes] if draft is not None else None
    at += len(draft_index)
    target_index = csr[at:at + nodes] if len(row_index) else None
    at += len(row_index)
    if len(dest):
        picked = drafts.tokens.reshape(-1).index_select(0, csr[at + len(dest):].long())
        tokens.index_copy_(0, csr[at:at + len(dest)].long(), picked.to(tokens.dtype))

    if use_logits:
        params, keys = _sampling_words(reqs, np.ones(n, dtype=np.int64), device)
        target = logits if target_index is not None else _target_rows(logits, spans)
        out_tokens, path, accepted, status = host_call(verify_stochastic_logits)(
            node_offsets, parents, tokens, target, params, draft, keys, cluster=cluster, draft_index=index,
            draft_totals=draft_totals, target_index=target_index)
        row_status = status[:0]
    else:
        params, keys = _sampling_words(reqs, sizes, device)
        target_totals = torch.empty(nodes, dtype=torch.float64, device=device)
        probs, row_status = host_call(sampling_probs)(_target_rows(logits, spans), params, cluster, target_totals)
        out_tokens, path, accepted, status = host_call(verify_stochastic)(
            node_offsets, parents, tokens, probs, draft, keys, cluster=cluster, draft_index=index,
            target_totals=target_totals, draft_totals=draft_totals)

    def finish(host: np.ndarray) -> list[Union[VerifyOutput, str]]:
        out_tokens, path, accepted, status, row_status = np.split(host, np.cumsum([nodes, nodes, n, n]))
        results = []
        for i, r in enumerate(reqs):
            a, b = int(offsets[i]), int(offsets[i + 1])
            rows_bad = row_status[a:b].tolist() if len(row_status) else []
            if any(rows_bad) or status[i]:
                sampling = f"sampling status {rows_bad}, " if rows_bad else ""
                results.append(f"request {r.id}: verification failed ({sampling}verify status {int(status[i])}): "
                               "non-finite logits or invalid sampling parameters")
                continue
            k = int(accepted[i])
            results.append(VerifyOutput(out_tokens[a:a + k + 1].copy(), path[a:a + k + 1].copy(), k))
        return results

    return _Queued(torch.cat([out_tokens, path, accepted, status, row_status]).to(torch.int64), finish)


def _contiguous(spans: list[tuple[int, int]]) -> bool:
    """Whether the spans follow one another."""
    return all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))


def _target_rows(logits: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
    """The rows ``[a, b)`` of each span, in order: a view of ``logits`` when the spans follow one
    another (the usual case: every deciding request of the step is in the group), else a copy."""
    if _contiguous(spans):
        return logits[spans[0][0]:spans[-1][1]]
    return torch.cat([logits[a:b] for a, b in spans])


def _draft_rows(dists: list[torch.Tensor], offsets: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    """The group's draft distributions (request i's ``[m_i, vocab]``: the rows of its first m_i
    nodes) as ONE ``[R, vocab]`` float32 tensor and the verify_stochastic ``draft_index``
    (int32 ``[nodes]``: node n's row, -1 for the nodes past its request's rows, the chains'
    leaves). When every request's rows are rows of one buffer (views of the draft graph
    runner's ``[steps, batch, vocab]`` distributions) the tensor is a view of that buffer and
    nothing is copied; otherwise the rows are concatenated."""
    index = np.full(int(offsets[-1]), -1, dtype=np.int32)
    base = _shared_rows(dists)
    if base is None:
        base = torch.cat(dists).float() if len(dists) > 1 else dists[0].float()
        starts = np.cumsum([0] + [len(d) for d in dists[:-1]])
        for i, d in enumerate(dists):
            m = min(len(d), int(offsets[i + 1] - offsets[i]))
            index[offsets[i]:offsets[i] + m] = np.arange(starts[i], starts[i] + m)
        return base, index
    vocab, origin = base.shape[1], base.storage_offset()
    for i, d in enumerate(dists):
        m = min(len(d), int(offsets[i + 1] - offsets[i]))
        first = (d.storage_offset() - origin) // vocab
        index[offsets[i]:offsets[i] + m] = first + np.arange(m) * (d.stride(0) // vocab)
    return base, index


def _shared_rows(dists: list[torch.Tensor]) -> Optional[torch.Tensor]:
    """A ``[R, vocab]`` view whose rows include every row of ``dists`` when they are all float32
    rows of one contiguous row-major buffer (whole rows, each a multiple of vocab elements from
    the first), else None."""
    vocab = dists[0].shape[1]
    storage = dists[0].untyped_storage().data_ptr()
    for d in dists:
        if (d.dtype != torch.float32 or d.dim() != 2 or d.shape[1] != vocab or len(d) == 0
                or d.untyped_storage().data_ptr() != storage or (vocab > 1 and d.stride(1) != 1)
                or (len(d) > 1 and d.stride(0) % vocab != 0)):
            return None
    origin = min(d.storage_offset() for d in dists)
    if any((d.storage_offset() - origin) % vocab for d in dists):
        return None
    rows = max((d.storage_offset() - origin) // vocab + (len(d) - 1) * (d.stride(0) // vocab) + 1 for d in dists)
    return dists[0].as_strided((rows, vocab), (vocab, 1), origin)


def _draft_positions(reqs: list, offsets: np.ndarray, drafts) -> tuple[np.ndarray, np.ndarray]:
    """For device-resident chains (``drafts``, tokens ``[K, n]``): where each of the group's
    draft nodes sits among the node tokens (dest) and where its token is in the row-major
    flattened drafts (src); empty without drafts."""
    if drafts is None:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    columns = {it.request.id: c for c, it in enumerate(drafts.items)}
    n = len(drafts.items)
    dest, src = [], []
    for i, r in enumerate(reqs):
        c = columns.get(r.id)
        if c is None:
            continue
        k = int(offsets[i + 1] - offsets[i]) - 1  # a chain: the root and its k drafts
        dest.extend(range(int(offsets[i]) + 1, int(offsets[i]) + 1 + k))
        src.extend(j * n + c for j in range(k))
    return np.array(dest, dtype=np.int64), np.array(src, dtype=np.int64)
