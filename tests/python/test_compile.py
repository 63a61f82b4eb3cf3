"""torch.compile over specd's custom ops and over the forwards the graph runners capture.

The ops are registered with fake implementations (specd.ops), so torch.compile traces each one
as a single opaque node. Every test compiles with ``fullgraph=True``, so a graph break fails it.
- Every op of ``test_ops.opcheck_samples``, compiled with backend ``aot_eager``
  (functionalization and the fake implementations, with the op's own arithmetic), returns what
  the eager op returns, bit for bit. It also mutates its in-place arguments (KV caches,
  buffers) the same way.
- The draft graph runner's forwards j >= 1 cover draft_step_inputs_inplace, the model forward
  with KernelAttention and the draft rows' sampling. The target graph runner's verify forward
  uses tree-masked attention over the paged cache. Both are tested with the torch layers and
  with the fused layer ops.
  - Compiled by ``aot_eager``, they give the same tokens, distributions, logits, KV caches and
    buffers as eager, bit for bit.
  - Compiled by inductor (which fuses and reorders the torch code between the ops, and takes
    F.linear for oneDNN's products, cpu_linear.py), the tokens are equal and the floats close.
- A step's target side compiled as one graph (the verify forward, then
  verify_stochastic_logits and sample_tokens on its logits) equals the eager step.
- GPU (skips without one): the draft forward (fused layers) compiled by inductor on CUDA
  (aot_eager where Triton is missing).
"""

import pytest
import torch

import specd
import specd.ops as ops
from specd.errors import InvalidArgumentError
from specd.engine.params import SamplingParams
from test_engine import self_draft
from test_ops import opcheck_samples


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # each test compiles its own functions from scratch
    yield
    torch._dynamo.reset()


def clone_args(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def as_tuple(out):
    return out if isinstance(out, tuple) else (() if out is None else (out,))


@pytest.mark.parametrize("index", range(len(opcheck_samples())))
def test_compiled_op_equals_eager_op(index):
    op, args = opcheck_samples()[index]
    eager_args, compiled_args = clone_args(args), clone_args(args)
    want = as_tuple(op(*eager_args))
    got = as_tuple(torch.compile(op, fullgraph=True, backend="aot_eager")(*compiled_args))
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and torch.equal(g, w)
    for e, c in zip(eager_args, compiled_args):  # in-place arguments mutated alike
        if isinstance(e, torch.Tensor):
            assert torch.equal(c, e)


def test_host_call_skips_the_dispatcher_but_not_under_compile():
    """ops.host_call(op): the op's registered implementation in eager code (the same results,
    without torch's dispatcher), the op itself while torch.compile traces (the implementation
    reads data pointers, which dynamo cannot trace), and any other callable unchanged."""
    op, args = opcheck_samples()[7]  # sampling_probs
    if ops.HAS_CUDA_KERNELS:
        assert ops.host_call(op) is not op
    for want, got in zip(op(*args), ops.host_call(op)(*args)):
        assert torch.equal(got, want)
    compiled = torch.compile(lambda *a: ops.host_call(op)(*a), fullgraph=True, backend="aot_eager")
    for want, got in zip(op(*args), compiled(*args)):
        assert torch.equal(got, want)
    stand_in = lambda *a: None  # noqa: E731
    assert ops.host_call(stand_in) is stand_in
    x, w = torch.zeros(2, 4, device="meta"), torch.ones(4, device="meta")
    if ops.HAS_CUDA_KERNELS:
        # A device without a kernel: the same specific error as through the dispatcher.
        with pytest.raises(InvalidArgumentError, match="rms_norm: supports cpu and cuda tensors, not meta"):
            ops.host_call(ops.rms_norm)(x, w, 1e-6)
    else:  # a build without nvcc: host_call is the op, and meta tensors take its fake
        assert ops.host_call(ops.rms_norm) is ops.rms_norm
        assert ops.host_call(ops.rms_norm)(x, w, 1e-6).device.type == "meta"


# ---- the graph runners' forwards ----


@pytest.fixture(scope="module")
def pair_dirs(tiny_qwen2_dir, tmp_path_factory):
    return tiny_qwen2_dir, self_draft(tiny_qwen2_dir, tmp_path_factory.mktemp("compile_draft"))


def runners_after_a_step(pair_dirs, device, fused: bool, cpu_linear=None):
    """An LLM whose graph runners hold the inputs of a real sampled verify step (two requests,
    k 4) in their buffers, and whose KV caches hold the requests' history. ``cpu_linear``: the
    models' LlamaModel.cpu_linear (None: the default, oneDNN's products where usable, which a
    compiled forward replaces by F.linear's)."""
    target, draft = pair_dirs
    llm = specd.LLM(str(target), str(draft), specd.SpeculationConfig(method="draft", num_speculative_tokens=4),
                    device=device, dtype="float32", draft_graph=True, target_graph=True)
    for model in (llm.target, llm.draft):
        model.fused = fused
        if cpu_linear is not None:
            model.cpu_linear = cpu_linear
    llm.generate(["def add(a, b):\n    return", "import os\n"],
                 SamplingParams(temperature=0.8, max_tokens=9, seed=3, ignore_eos=True))
    return llm


def state_of(runner, buf) -> list[torch.Tensor]:
    """What a forward may write: the bucket's buffers and the model's KV caches."""
    return ([t for t in vars(buf).values() if isinstance(t, torch.Tensor)]
            + [t for layer in runner.kv for t in (layer.k, layer.v)])


def eager_and_compiled(fn, state: list[torch.Tensor], backend: str):
    """``fn()``'s outputs and the state after it, eager then compiled, from the same state."""
    before = [t.clone() for t in state]
    want = as_tuple(fn())
    want_state = [t.clone() for t in state]
    for t, b in zip(state, before):
        t.copy_(b)
    got = as_tuple(torch.compile(fn, fullgraph=True, backend=backend)())
    return want, want_state, got, [t.clone() for t in state]


def assert_same(want, got, exact: bool):
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape
        if exact or not g.is_floating_point():
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def draft_forwards(llm):
    """Forwards 1 and 2 of the draft graph runner on its bucket's buffers: their tokens and
    distributions."""
    runner = llm.draft_graph
    buf = next(iter(runner._buffers.values()))

    def forwards():
        runner._forward(buf, 1, True)
        runner._forward(buf, 2, True)
        return buf.tokens[1:3].clone(), buf.probs[1:3].clone(), buf.totals[1:3].clone()

    return forwards, state_of(runner, buf)


def target_forward(llm):
    runner = llm.target_graph
    buf = next(iter(runner._buffers.values()))
    return (lambda: runner._forward(buf).clone()), state_of(runner, buf)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("forward", [draft_forwards, target_forward])
def test_compiled_runner_forward_equals_eager_exactly(pair_dirs, forward, fused):
    """aot_eager: the ops and the torch code as eager runs them, traced into one graph (with
    F.linear's products, which the compiled forward takes)."""
    fn, state = forward(runners_after_a_step(pair_dirs, "cpu", fused, cpu_linear="torch"))
    want, want_state, got, got_state = eager_and_compiled(fn, state, "aot_eager")
    assert_same(want, got, exact=True)
    assert_same(want_state, got_state, exact=True)


def test_compiling_a_fused_forward_before_an_eager_one_says_why(pair_dirs):
    """The fused forward concatenates the projections on its first eager run (not traceable):
    compiled before that, the trace stops at a specific message."""
    llm = runners_after_a_step(pair_dirs, "cpu", fused=False, cpu_linear="torch")
    fn, _ = draft_forwards(llm)
    llm.draft.fused = True  # no fused forward has run
    with pytest.raises(Exception, match="run one fused forward eagerly first"):
        torch.compile(fn, fullgraph=True, backend="aot_eager")()


@pytest.mark.parametrize("forward", [draft_forwards, target_forward])
def test_inductor_runner_forward_equals_eager(pair_dirs, forward):
    """inductor (its own kernels for the torch code between the ops), from the default CPU
    products (oneDNN's, F.linear's when compiled): tokens equal, floats close."""
    fn, state = forward(runners_after_a_step(pair_dirs, "cpu", fused=False))
    want, want_state, got, got_state = eager_and_compiled(fn, state, "inductor")
    assert_same(want, got, exact=False)
    assert_same(want_state, got_state, exact=False)


def test_compiled_verify_step_equals_eager(pair_dirs):
    """The target side of a sampled step in one compiled graph: the verify forward, then
    verification from its logits (the two requests' chains, one-hot drafts) and a token per
    request from its root row."""
    llm = runners_after_a_step(pair_dirs, "cpu", fused=False, cpu_linear="torch")
    runner = llm.target_graph
    buf = next(iter(runner._buffers.values()))
    batch, q = buf.batch, buf.q
    offsets = torch.arange(0, batch * q + 1, q, dtype=torch.int32)
    parents = torch.arange(-1, q - 1, dtype=torch.int32).repeat(batch)
    tokens = buf.device["input_ids"].to(torch.int32)
    params = ops.pack_sampling_params(torch.tensor([0.8, 1.0]), torch.tensor([0, 5]), torch.tensor([0.9, 1.0]),
                                      torch.tensor([0.0, 0.05]))[:batch]
    keys = ops.pack_rng_keys(torch.tensor(7), torch.arange(batch), torch.tensor(0), torch.tensor(40))

    def step():
        logits = runner._forward(buf)[:batch * q]
        verified = ops.verify_stochastic_logits(offsets, parents, tokens, logits, params, None, keys)
        roots = ops.sample_tokens(logits[::q], params, keys)
        return (*verified, *roots)

    want, want_state, got, got_state = eager_and_compiled(step, state_of(runner, buf), "aot_eager")
    assert_same(want, got, exact=True)
    assert_same(want_state, got_state, exact=True)
    assert int(want[3].abs().sum()) == 0  # every request verified (status 0)


def test_gpu_inductor_draft_forward_equals_eager(pair_dirs):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not ops.HAS_CUDA_KERNELS:
        pytest.skip("specd built without CUDA kernels")
    from torch.utils._triton import has_triton

    # inductor generates Triton kernels on CUDA; where Triton is missing, aot_eager still
    # traces the ops and the fused forward into one graph (then exactly).
    backend = "inductor" if has_triton() else "aot_eager"
    fn, state = draft_forwards(runners_after_a_step(pair_dirs, "cuda", fused=True))
    want, want_state, got, got_state = eager_and_compiled(fn, state, backend)
    assert_same(want, got, exact=backend == "aot_eager")
    assert_same(want_state, got_state, exact=backend == "aot_eager")
