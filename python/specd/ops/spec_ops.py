"""Custom ops of the batched sampling and verification kernels (rules:
cpp/include/specd/sampling_batch.h, verify_batch.h): ``specd::sample_tokens``,
``specd::sampling_probs``, ``specd::sample_tokens_and_probs`` (and its ``_out`` form), ``specd::verify_greedy``, ``specd::verify_greedy_tokens``,
``specd::verify_stochastic``, ``specd::verify_stochastic_logits``.

Per-row parameters travel as packed int64 words built on the rows' device (no host sync):
:func:`pack_sampling_params` (``[rows, 4]``, the C++ ``SamplingParams``) and
:func:`pack_rng_keys` (``[rows, 3]``, ``RngKey``). Per-row or per-request input errors do not
raise: they come back in ``status`` (``SampleStatus`` / ``VerifyStatus``, 0 = ok).

Trees are flattened (CSR): request r owns nodes ``[node_offsets[r], node_offsets[r+1])`` of
``parents`` (local indices, -1 for the root) and ``tokens`` (int32); node n is row n of the
target/draft rows. Outputs: ``out_stride == 0`` gives the node layout ``[num_nodes]``,
``out_stride > 0`` the padded layout ``[batch, out_stride]`` (the ``path`` kv_compact takes).
"""

import functools
from typing import Optional

import torch

from specd import _core
from specd.ops._checks import (common_device, expect, expect_shape, fail, index, kernel_dtype, launch,
                               no_kernel_for_device, register_kernels, rows)

__all__ = ["sample_tokens", "sampling_probs", "sample_tokens_and_probs", "sample_tokens_and_probs_out", "verify_greedy",
           "verify_greedy_tokens", "verify_stochastic", "verify_stochastic_logits", "pack_sampling_params",
           "pack_rng_keys"]

_WORD = 0xFFFFFFFF
VerifyResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def pack_sampling_params(temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                         min_p: torch.Tensor) -> torch.Tensor:
    """Per-row sampling parameters ``[rows]`` each -> int64 ``[rows, 4]``, the memory layout of
    ``specd::SamplingParams`` (temperature, top_k in the low half of word 1, top_p, min_p), on
    the inputs' device. Values are validated per row by the kernels (status 1)."""
    return torch.stack([temperature.to(torch.float64).view(torch.int64), top_k.to(torch.int64) & _WORD,
                        top_p.to(torch.float64).view(torch.int64), min_p.to(torch.float64).view(torch.int64)],
                       dim=1).contiguous()


def pack_rng_keys(seed: torch.Tensor, request: torch.Tensor, step: torch.Tensor,
                  position: torch.Tensor) -> torch.Tensor:
    """Per-row Philox keys (int64 tensors ``[rows]``, or broadcastable) -> int64 ``[rows, 3]``, the
    memory layout of ``specd::RngKey``: seed (its 64 bits), request | step << 32, position."""
    seed, request, step, position = torch.broadcast_tensors(
        *(torch.as_tensor(x, dtype=torch.int64, device=seed.device).reshape(-1) for x in (seed, request, step, position)))
    return torch.stack([seed, (request & _WORD) | ((step & _WORD) << 32), position & _WORD], dim=1).contiguous()


def _logits(op: str, name: str, t: torch.Tensor) -> tuple[torch.Tensor, int, str]:
    if t.dim() != 2:
        fail(op, f"{name} must be [rows, vocab], got shape {tuple(t.shape)}")
    dtype = kernel_dtype(op, name, t)
    t, stride = rows(op, name, t, (t.shape[1],))
    return t, stride, dtype


def _packed(op: str, name: str, t: torch.Tensor, rows_: int, words: int) -> torch.Tensor:
    return index(op, name, t, torch.int64, (rows_, words))


# ---- sampling ----

@torch.library.custom_op("specd::sample_tokens", mutates_args=())
def sample_tokens(logits: torch.Tensor, params: torch.Tensor, rng: torch.Tensor,
                  cluster: bool = False, gumbel: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per logits row (sampling_batch.h). logits ``[rows, vocab]`` float32/float16/
    bfloat16; params int64 ``[rows, 4]`` (:func:`pack_sampling_params`); rng int64 ``[rows, 3]``
    (:func:`pack_rng_keys`). Returns (tokens int32 ``[rows]``, -1 where status != 0; status int32).
    cluster: on an sm_90+ GPU, a thread-block cluster of 8 blocks per row instead of one block
    (cuda/row_split.h ``RowSplit``; validated on an H100, where it is 1.2-2.8x faster for
    sampled rows; elsewhere and on the CPU it changes nothing). The same for the other
    sampling ops.
    gumbel: draw sampled rows' tokens by the Gumbel-max rule (``DrawRule::kGumbelMax``,
    cpp/include/specd/detail/gumbel.h): the same distribution, other tokens for the same seed;
    one pass over a row without a top-k/top-p/min-p cut, and GPU tokens equal to the CPU's
    exactly. Greedy rows are unchanged."""
    no_kernel_for_device("sample_tokens", logits, params, rng)


def _sampling_inputs(op: str, logits, params, rng):
    """Checked inputs of the ops that draw tokens, and their (tokens, status) outputs."""
    device = common_device(op, logits=logits, params=params, rng=rng)
    logits, stride, dtype = _logits(op, "logits", logits)
    n = logits.shape[0]
    params = _packed(op, "params", params, n, 4)
    rng = _packed(op, "rng", rng, n, 3)
    # Every row's token and status are written (sampling_batch.h): no fill kernels.
    tokens = torch.empty(n, dtype=torch.int32, device=device)
    status = torch.empty(n, dtype=torch.int32, device=device)
    return device, logits, stride, dtype, params, rng, tokens, status


def _sample_tokens(logits, params, rng, cluster=False, gumbel=False):
    device, logits, stride, dtype, params, rng, tokens, status = _sampling_inputs("sample_tokens", logits, params, rng)
    n, vocab = logits.shape
    if n:
        draw = _draw_option(gumbel)
        launch(device, functools.partial(_core.sample_tokens_batch_cpu, **draw), "sample_tokens_batch_cuda",
               logits.data_ptr(), dtype, n, vocab, stride, params.data_ptr(), rng.data_ptr(), tokens.data_ptr(),
               status.data_ptr(), **_cluster_option(cluster), **draw)
    return tokens, status


def _draw_option(gumbel: bool) -> dict:
    """The launchers' keyword for the Gumbel-max draw (none when off: the calls stay as before)."""
    return {"gumbel": True} if gumbel else {}


def _cluster_option(cluster: bool) -> dict:
    """The CUDA launchers' keyword for a cluster of blocks per row (none when off, so the
    launch is the one-block kernels' exactly)."""
    return {"cluster": True} if cluster else {}


@sample_tokens.register_fake
def _(logits, params, rng, cluster=False, gumbel=False):
    n = logits.shape[0]
    return logits.new_empty((n,), dtype=torch.int32), logits.new_empty((n,), dtype=torch.int32)


@torch.library.custom_op("specd::sampling_probs", mutates_args=("totals",))
def sampling_probs(logits: torch.Tensor, params: torch.Tensor, cluster: bool = False,
                   totals: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampling distribution of each logits row (sampling.h rules). Returns (probs float32
    ``[rows, vocab]``, zeros where status != 0; status int32 ``[rows]``). totals: float64
    ``[rows]``, written with each row's total (its floats summed as verification sums them; 0
    for a failed row), what :func:`verify_stochastic` takes as ``target_totals`` so that it
    need not read a whole row to normalize it."""
    no_kernel_for_device("sampling_probs", logits, params)


def _totals_option(op: str, totals: Optional[torch.Tensor], n: int) -> dict:
    """The launchers' keyword for a float64 ``[n]`` totals output (none when absent)."""
    if totals is None:
        return {}
    expect(op, "totals", totals, torch.float64, 1)
    expect_shape(op, "totals", totals, (n,))
    if not totals.is_contiguous():
        fail(op, "totals must be contiguous")
    return {"totals_ptr": totals.data_ptr()}


def _sampling_probs(logits, params, cluster=False, totals=None):
    op = "sampling_probs"
    device = common_device(op, logits=logits, params=params, totals=totals)
    logits, stride, dtype = _logits(op, "logits", logits)
    n, vocab = logits.shape
    params = _packed(op, "params", params, n, 4)
    with_totals = _totals_option(op, totals, n)
    probs = torch.empty((n, vocab), dtype=torch.float32, device=device)  # every element is written
    status = torch.empty(n, dtype=torch.int32, device=device)
    if n:
        launch(device, functools.partial(_core.sampling_probs_batch_cpu, **with_totals), "sampling_probs_batch_cuda",
               logits.data_ptr(), dtype, n, vocab, stride, params.data_ptr(), probs.data_ptr(), status.data_ptr(),
               **_cluster_option(cluster), **with_totals)
    return probs, status


@sampling_probs.register_fake
def _(logits, params, cluster=False, totals=None):
    return (logits.new_empty(logits.shape, dtype=torch.float32),
            logits.new_empty((logits.shape[0],), dtype=torch.int32))


@torch.library.custom_op("specd::sample_tokens_and_probs", mutates_args=())
def sample_tokens_and_probs(logits: torch.Tensor, params: torch.Tensor, rng: torch.Tensor,
                            cluster: bool = False, gumbel: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`sample_tokens` and :func:`sampling_probs` in one call (one kernel launch): each
    row's token (the same as sample_tokens gives) drawn from its probability row (the same bits
    as sampling_probs), what a sampling draft step needs. Returns (tokens int32 ``[rows]``,
    probs float32 ``[rows, vocab]``, status int32 ``[rows]``). gumbel: the tokens drawn from the
    written rows by the Gumbel-max rule (``sample_tokens_and_probs_cpu``, sampling_batch.h):
    the same rows, the same distribution, other tokens (and not sample_tokens(gumbel=True)'s);
    no sum and no second pass over the row."""
    no_kernel_for_device("sample_tokens_and_probs", logits, params, rng)


def _sample_tokens_and_probs(logits, params, rng, cluster=False, gumbel=False):
    return _sample_into("sample_tokens_and_probs", logits, params, rng, cluster=cluster, gumbel=gumbel)


def _sample_into(op: str, logits, params, rng, probs=None, cluster=False,
                 gumbel=False, totals=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel of both sample_tokens_and_probs ops: (tokens, probs, status), the rows
    written into ``probs`` (a new tensor when None), their totals into ``totals`` if given."""
    device, logits, stride, dtype, params, rng, tokens, status = _sampling_inputs(op, logits, params, rng)
    n, vocab = logits.shape
    common_device(op, logits=logits, totals=totals)
    with_totals = _totals_option(op, totals, n)
    if probs is None:  # every element of a row is written (zeros on a failed row): no memset
        probs = torch.empty((n, vocab), dtype=torch.float32, device=device)
    common_device(op, logits=logits, probs=probs)
    expect(op, "probs", probs, torch.float32, 2)
    expect_shape(op, "probs", probs, (n, vocab))
    if not probs.is_contiguous():
        fail(op, "probs must be contiguous (its rows are written in place)")
    if n:
        draw = _draw_option(gumbel)
        launch(device, functools.partial(_core.sample_tokens_and_probs_batch_cpu, **draw, **with_totals),
               "sample_tokens_and_probs_batch_cuda", logits.data_ptr(), dtype, n, vocab, stride, params.data_ptr(),
               rng.data_ptr(), tokens.data_ptr(), probs.data_ptr(), status.data_ptr(), **_cluster_option(cluster),
               **draw, **with_totals)
    return tokens, probs, status


@sample_tokens_and_probs.register_fake
def _(logits, params, rng, cluster=False, gumbel=False):
    n = logits.shape[0]
    return (logits.new_empty((n,), dtype=torch.int32), logits.new_empty(logits.shape, dtype=torch.float32),
            logits.new_empty((n,), dtype=torch.int32))


@torch.library.custom_op("specd::sample_tokens_and_probs_out", mutates_args=("probs", "totals"))
def sample_tokens_and_probs_out(logits: torch.Tensor, params: torch.Tensor, rng: torch.Tensor,
                                probs: torch.Tensor, cluster: bool = False, gumbel: bool = False,
                                totals: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_tokens_and_probs` writing the distributions into ``probs`` (float32
    ``[rows, vocab]``, contiguous, on the logits' device; every element is overwritten) instead
    of a new tensor: the draft graph's buffers take them with no copy. Returns (tokens int32
    ``[rows]``, status int32 ``[rows]``). gumbel: as sample_tokens_and_probs'. totals: as
    :func:`sampling_probs`' (verify_stochastic's ``draft_totals``)."""
    no_kernel_for_device("sample_tokens_and_probs_out", logits, params, rng, probs)


def _sample_tokens_and_probs_out(logits, params, rng, probs, cluster=False, gumbel=False, totals=None):
    tokens, _, status = _sample_into("sample_tokens_and_probs_out", logits, params, rng, probs, cluster=cluster,
                                     gumbel=gumbel, totals=totals)
    return tokens, status


@sample_tokens_and_probs_out.register_fake
def _(logits, params, rng, probs, cluster=False, gumbel=False, totals=None):
    n = logits.shape[0]
    return logits.new_empty((n,), dtype=torch.int32), logits.new_empty((n,), dtype=torch.int32)


# ---- verification ----

def _trees(op: str, node_offsets, parents, tokens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    offsets = index(op, "node_offsets", node_offsets, torch.int32, (-1,))
    if offsets.shape[0] < 1:
        fail(op, "node_offsets must have batch + 1 >= 1 entries")
    nodes = parents.shape[0] if parents.dim() == 1 else -1
    parents = index(op, "parents", parents, torch.int32, (nodes,))
    tokens = index(op, "tokens", tokens, torch.int32, (nodes,))
    return offsets, parents, tokens, offsets.shape[0] - 1, nodes


def _outputs(op: str, device, batch: int, nodes: int, out_stride: int) -> VerifyResult:
    if out_stride < 0:
        fail(op, f"out_stride must be >= 0 (0: node layout), got {out_stride}")
    shape = (nodes,) if out_stride == 0 else (batch, out_stride)
    # verify_batch.h: every request's status and accepted count are written, and so is every
    # row of the padded layout; in the node layout the nodes of a request whose offsets are
    # invalid are not, so they are filled with -1 first (the fill kernels are skipped otherwise).
    row = (lambda: torch.empty(shape, dtype=torch.int32, device=device)) if out_stride else (
        lambda: torch.full(shape, -1, dtype=torch.int32, device=device))
    return (row(), row(), torch.empty(batch, dtype=torch.int32, device=device),
            torch.empty(batch, dtype=torch.int32, device=device))


def _fake_outputs(node_offsets, parents, out_stride) -> VerifyResult:
    batch = node_offsets.shape[0] - 1
    shape = (parents.shape[0],) if out_stride == 0 else (batch, out_stride)
    return (parents.new_empty(shape), parents.new_empty(shape), parents.new_empty((batch,)),
            parents.new_empty((batch,)))


def _out_ptrs(out: VerifyResult, out_stride: int) -> tuple:
    return (out[0].data_ptr(), out[1].data_ptr(), out[2].data_ptr(), out[3].data_ptr(), out_stride)


@torch.library.custom_op("specd::verify_greedy", mutates_args=())
def verify_greedy(node_offsets: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, target: torch.Tensor,
                  out_stride: int = 0, cluster: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy verification of a batch of token trees from the target's logits rows ``[rows >=
    num_nodes, vocab]`` (float32/float16/bfloat16). Returns (tokens, path, num_accepted, status),
    int32; tokens/path in the node or padded layout (module docstring). cluster: on an sm_90+
    GPU, a thread-block cluster of 8 blocks per request instead of one 1024-thread block (the
    same results; one block per request uses only ``batch`` SMs); elsewhere nothing changes."""
    no_kernel_for_device("verify_greedy", node_offsets, parents, tokens, target)


def _verify_greedy(node_offsets, parents, tokens, target, out_stride=0, cluster=False):
    op = "verify_greedy"
    device = common_device(op, node_offsets=node_offsets, parents=parents, tokens=tokens, target=target)
    offsets, parents, tokens, batch, nodes = _trees(op, node_offsets, parents, tokens)
    target, stride, dtype = _logits(op, "target", target)
    out = _outputs(op, device, batch, nodes, out_stride)
    if batch:
        launch(device, _core.verify_greedy_batch_cpu, "verify_greedy_batch_cuda", offsets.data_ptr(),
               parents.data_ptr(), tokens.data_ptr(), batch, nodes, target.data_ptr(), dtype, target.shape[0],
               target.shape[1], stride, *_out_ptrs(out, out_stride), **_cluster_option(cluster))
    return out


@verify_greedy.register_fake
def _(node_offsets, parents, tokens, target, out_stride=0, cluster=False):
    return _fake_outputs(node_offsets, parents, out_stride)


@torch.library.custom_op("specd::verify_greedy_tokens", mutates_args=())
def verify_greedy_tokens(node_offsets: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor,
                         target_tokens: torch.Tensor, out_stride: int = 0,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy verification from the target's argmax per node (int32 ``[num_nodes]``). Returns
    (tokens, path, num_accepted, status) as :func:`verify_greedy`."""
    no_kernel_for_device("verify_greedy_tokens", node_offsets, parents, tokens, target_tokens)


def _verify_greedy_tokens(node_offsets, parents, tokens, target_tokens, out_stride=0):
    op = "verify_greedy_tokens"
    device = common_device(op, node_offsets=node_offsets, parents=parents, tokens=tokens,
                           target_tokens=target_tokens)
    offsets, parents, tokens, batch, nodes = _trees(op, node_offsets, parents, tokens)
    target_tokens = index(op, "target_tokens", target_tokens, torch.int32, (nodes,))
    out = _outputs(op, device, batch, nodes, out_stride)
    if batch:
        launch(device, _core.verify_greedy_tokens_batch_cpu, "verify_greedy_tokens_batch_cuda", offsets.data_ptr(),
               parents.data_ptr(), tokens.data_ptr(), batch, nodes, target_tokens.data_ptr(),
               *_out_ptrs(out, out_stride))
    return out


@verify_greedy_tokens.register_fake
def _(node_offsets, parents, tokens, target_tokens, out_stride=0):
    return _fake_outputs(node_offsets, parents, out_stride)


@torch.library.custom_op("specd::verify_stochastic", mutates_args=())
def verify_stochastic(node_offsets: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor,
                      target_probs: torch.Tensor, draft_probs: Optional[torch.Tensor], rng: torch.Tensor,
                      draft_sampling: str = "without_replacement", out_stride: int = 0, cluster: bool = False,
                      draft_index: Optional[torch.Tensor] = None, target_totals: Optional[torch.Tensor] = None,
                      draft_totals: Optional[torch.Tensor] = None,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless stochastic verification (verify.h rules) of a batch of trees.

    target_probs, draft_probs: float32 ``[rows >= num_nodes, vocab]`` distributions (after the
    sampling rules); draft_probs None: deterministic proposals. rng: int64 ``[batch, 3]``
    (:func:`pack_rng_keys`, position = the first token decided). draft_sampling:
    "without_replacement" or "independent". cluster: a thread-block cluster per request on
    sm_90+ GPUs (as the sampling ops' ``cluster``). draft_index: int32 ``[num_nodes]``, node
    n's row of draft_probs (any number of rows; -1: none, fine for a leaf, status 4 at a node
    with children), so the draft's distributions need no gather into node order; None: row n.
    target_totals / draft_totals: float64, each row's total as :func:`sampling_probs` /
    :func:`sample_tokens_and_probs_out` write them (``[rows]`` of target_probs / draft_probs):
    a row is then read whole only where a rejection or the final draw needs it (verify_batch.h,
    StochasticRowOptions); a total must be its row's sum.
    Returns (tokens, path, num_accepted, status).
    """
    no_kernel_for_device("verify_stochastic", node_offsets, parents, tokens, target_probs)


def _draft_args(op: str, draft_probs, vocab: int, nodes: int, draft_index, draft_totals) -> tuple:
    """The draft rows' launcher arguments (pointer, rows, stride), the StochasticRowOptions
    pointers of the draft (``draft_index_ptr``, ``draft_totals_ptr``) and the tensors they point
    into (kept alive until the launch)."""
    draft_ptr, d_rows, d_stride = 0, 0, 0
    kept = []
    if draft_probs is not None:
        expect(op, "draft_probs", draft_probs, torch.float32, 2)
        if draft_probs.shape[1] != vocab:
            fail(op, f"draft_probs has vocab {draft_probs.shape[1]}, the target {vocab}")
        draft, d_stride = rows(op, "draft_probs", draft_probs, (vocab,))
        draft_ptr, d_rows = draft.data_ptr(), draft.shape[0]
        kept.append(draft)
    options = {}
    if draft_probs is None and (draft_index is not None or draft_totals is not None):
        fail(op, "draft_index and draft_totals need draft_probs")
    if draft_index is not None:
        kept.append(index(op, "draft_index", draft_index, torch.int32, (nodes,)))
        options["draft_index_ptr"] = kept[-1].data_ptr()
    if draft_totals is not None:
        kept.append(_totals(op, "draft_totals", draft_totals, d_rows))
        options["draft_totals_ptr"] = kept[-1].data_ptr()
    return (draft_ptr, d_rows, d_stride), options, kept


def _totals(op: str, name: str, totals: torch.Tensor, n: int) -> torch.Tensor:
    expect(op, name, totals, torch.float64, 1)
    expect_shape(op, name, totals, (n,))
    return totals.contiguous()


def _draft_sampling(op: str, draft_sampling: str) -> str:
    if draft_sampling not in ("without_replacement", "independent"):
        fail(op, f"draft_sampling must be 'without_replacement' or 'independent', got {draft_sampling!r}")
    return draft_sampling


def _verify_stochastic(node_offsets, parents, tokens, target_probs, draft_probs, rng,
                       draft_sampling="without_replacement", out_stride=0, cluster=False, draft_index=None,
                       target_totals=None, draft_totals=None):
    op = "verify_stochastic"
    device = common_device(op, node_offsets=node_offsets, parents=parents, tokens=tokens,
                           target_probs=target_probs, draft_probs=draft_probs, rng=rng, draft_index=draft_index,
                           target_totals=target_totals, draft_totals=draft_totals)
    offsets, parents, tokens, batch, nodes = _trees(op, node_offsets, parents, tokens)
    expect(op, "target_probs", target_probs, torch.float32, 2)
    target, t_stride = rows(op, "target_probs", target_probs, (target_probs.shape[1],))
    vocab = target.shape[1]
    draft, options, kept = _draft_args(op, draft_probs, vocab, nodes, draft_index, draft_totals)
    if target_totals is not None:
        kept.append(_totals(op, "target_totals", target_totals, target.shape[0]))
        options["target_totals_ptr"] = kept[-1].data_ptr()
    rng = _packed(op, "rng", rng, batch, 3)
    draft_sampling = _draft_sampling(op, draft_sampling)
    out = _outputs(op, device, batch, nodes, out_stride)
    if batch:
        launch(device, functools.partial(_core.verify_stochastic_batch_cpu, **options), "verify_stochastic_batch_cuda",
               offsets.data_ptr(), parents.data_ptr(), tokens.data_ptr(), batch, nodes, target.data_ptr(),
               target.shape[0], vocab, t_stride, *draft, draft_sampling, rng.data_ptr(),
               *_out_ptrs(out, out_stride), **_cluster_option(cluster), **options)
    return out


@verify_stochastic.register_fake
def _(node_offsets, parents, tokens, target_probs, draft_probs, rng, draft_sampling="without_replacement",
      out_stride=0, cluster=False, draft_index=None, target_totals=None, draft_totals=None):
    return _fake_outputs(node_offsets, parents, out_stride)


@torch.library.custom_op("specd::verify_stochastic_logits", mutates_args=())
def verify_stochastic_logits(node_offsets: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor,
                             target_logits: torch.Tensor, target_params: torch.Tensor,
                             draft_probs: Optional[torch.Tensor], rng: torch.Tensor,
                             draft_sampling: str = "without_replacement", out_stride: int = 0, cluster: bool = False,
                             draft_index: Optional[torch.Tensor] = None, draft_totals: Optional[torch.Tensor] = None,
                             target_index: Optional[torch.Tensor] = None,
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`verify_stochastic` from the target's logits: node n's target distribution is
    :func:`sampling_probs` of ``target_logits`` row n (``[rows >= num_nodes, vocab]``,
    float32/float16/bfloat16) with its request's parameters (``target_params``: int64 ``[batch,
    4]``, :func:`pack_sampling_params`), computed only for the nodes the walk visits (verify_batch.h,
    TargetLogits): no ``[num_nodes, vocab]`` probability rows are written, and rows the walk does
    not reach are not read. The results equal ``verify_stochastic(sampling_probs(...), target_totals=...)``
    (the same bits on the CPU). Per-request statuses as there, plus 9 (kBadSamplingParams) for
    invalid parameters; a visited row with a NaN/+inf or no finite logit gives 3. draft_probs,
    rng, draft_sampling, out_stride, cluster, draft_index, draft_totals: as :func:`verify_stochastic`.
    target_index: int32 ``[num_nodes]``, node n's row of target_logits (any number of rows; a
    visited node whose row is outside them: status 3), so a step's logits need no gather;
    None: row n. Returns (tokens, path, num_accepted, status)."""
    no_kernel_for_device("verify_stochastic_logits", node_offsets, parents, tokens, target_logits)


def _verify_stochastic_logits(node_offsets, parents, tokens, target_logits, target_params, draft_probs, rng,
                              draft_sampling="without_replacement", out_stride=0, cluster=False, draft_index=None,
                              draft_totals=None, target_index=None):
    op = "verify_stochastic_logits"
    device = common_device(op, node_offsets=node_offsets, parents=parents, tokens=tokens,
                           target_logits=target_logits, target_params=target_params, draft_probs=draft_probs,
                           rng=rng, draft_index=draft_index, draft_totals=draft_totals, target_index=target_index)
    offsets, parents, tokens, batch, nodes = _trees(op, node_offsets, parents, tokens)
    target, stride, dtype = _logits(op, "target_logits", target_logits)
    vocab = target.shape[1]
    params = _packed(op, "target_params", target_params, batch, 4)
    draft, options, kept = _draft_args(op, draft_probs, vocab, nodes, draft_index, draft_totals)
    if target_index is not None:
        kept.append(index(op, "target_index", target_index, torch.int32, (nodes,)))
        options["target_index_ptr"] = kept[-1].data_ptr()
    elif target.shape[0] < nodes:
        fail(op, f"target_logits has {target.shape[0]} rows for {nodes} nodes (one per node, or a target_index)")
    rng = _packed(op, "rng", rng, batch, 3)
    draft_sampling = _draft_sampling(op, draft_sampling)
    out = _outputs(op, device, batch, nodes, out_stride)
    if batch:
        launch(device, functools.partial(_core.verify_stochastic_logits_batch_cpu, **options),
               "verify_stochastic_logits_batch_cuda", offsets.data_ptr(), parents.data_ptr(), tokens.data_ptr(), batch,
               nodes, target.data_ptr(), dtype, target.shape[0], vocab, stride, params.data_ptr(), *draft,
               draft_sampling, rng.data_ptr(), *_out_ptrs(out, out_stride), **_cluster_option(cluster), **options)
    return out


@verify_stochastic_logits.register_fake
def _(node_offsets, parents, tokens, target_logits, target_params, draft_probs, rng,
      draft_sampling="without_replacement", out_stride=0, cluster=False, draft_index=None, draft_totals=None,
      target_index=None):
    return _fake_outputs(node_offsets, parents, out_stride)


register_kernels(sample_tokens, _sample_tokens)
register_kernels(sampling_probs, _sampling_probs)
register_kernels(sample_tokens_and_probs, _sample_tokens_and_probs)
register_kernels(sample_tokens_and_probs_out, _sample_tokens_and_probs_out)
register_kernels(verify_greedy, _verify_greedy)
register_kernels(verify_greedy_tokens, _verify_greedy_tokens)
register_kernels(verify_stochastic, _verify_stochastic)
register_kernels(verify_stochastic_logits, _verify_stochastic_logits)
