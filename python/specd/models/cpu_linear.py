"""The linear products of the torch forward on the CPU: oneDNN's inner product
(``torch.ops.mkldnn._linear_pointwise``, on the model's own weight tensors: no copy, no
repacking) instead of ``F.linear``, which torch's CPU wheels send to MKL's sgemm.

Why: decoding and verification multiply a few rows by each weight. On the 2-core CPU of
docs/benchmarks.md ("oneDNN linears on the CPU"), MKL's float32 sgemm for 2-9 rows cost up
to 3.4x its one-row cost (3 and 7 rows were its slowest shapes), while oneDNN's inner product
cost at most 1.8x its one-row cost, itself 1.3-1.8x cheaper than MKL's: the
target's LM head (151,936 x 1,536 float32) took 58.8 / 125 / 189 ms for 1 / 2 / 3 rows
with F.linear and 33.4 / 35.1 / 37.4 ms with oneDNN.

In bfloat16 torch already computes F.linear with oneDNN (the two timed the same), so the
choice matters for float32: the dtype "auto" picks on CPUs without native bf16 matmul, and
the dtype of the tests.

Rules:
- By default oneDNN is used for a float32 model on the CPU when torch has it
  (``torch.backends.mkldnn``) and a probe product matches ``F.linear`` to float tolerance;
  otherwise, and for products of 0 rows, ``F.linear``. Asked for explicitly ("onednn"), it
  also serves bfloat16.
- The two round differently (a different summation order), so a model takes one of them for
  all its forwards (``LlamaModel.cpu_linear``): plain decoding and speculation then compute
  with the same products, as on the GPU.
- Under torch.compile, ``onednn_linear`` is ``F.linear``: inductor lowers oneDNN's op only for
  weights it freezes as constants, and picks its own product kernels for ``F.linear`` (so a
  compiled forward rounds differently from the eager one in either case).
- Nothing here keeps state: the choice is the model's, resolved once per (device, dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specd.errors import InvalidArgumentError

# LlamaModel.cpu_linear values.
ONEDNN = "onednn"
TORCH = "torch"
CHOICES = (ONEDNN, TORCH)


def torch_linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``F.linear`` with ``layer``'s weight and bias. x ``[T, in]`` -> ``[T, out]``."""
    return F.linear(x, layer.weight, layer.bias)


def onednn_linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """oneDNN's inner product with ``layer``'s weight and bias (``F.linear`` for 0 rows).
    x ``[T, in]`` (CPU, the weight's dtype) -> ``[T, out]``."""
    if x.shape[0] == 0 or torch.compiler.is_compiling():
        return F.linear(x, layer.weight, layer.bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), layer.weight, layer.bias, "none", [], "")


def onednn_usable(dtype: torch.dtype) -> bool:
    """Whether oneDNN's inner product runs here for ``dtype`` and agrees with F.linear on a
    small random product (with a bias, 3 rows) to that dtype's rounding."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    gen = torch.Generator().manual_seed(0)
    layer = nn.Linear(64, 48)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(48, 64, generator=gen))
        layer.bias.copy_(torch.randn(48, generator=gen))
    layer = layer.to(dtype)
    x = torch.randn(3, 64, generator=gen).to(dtype)
    try:
        with torch.no_grad():
            got = onednn_linear(x, layer).float()
    except (RuntimeError, NotImplementedError):
        return False
    want = F.linear(x.float(), layer.weight.float(), layer.bias.float())
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    return got.shape == want.shape and bool(torch.allclose(got, want, rtol=tol, atol=tol * 8))


def resolve(choice: str | None, device: torch.device, dtype: torch.dtype) -> str:
    """The products a model on ``device`` in ``dtype`` takes: ``choice`` ("onednn", "torch")
    or, for None, oneDNN for float32 on the CPU where ``onednn_usable`` (torch already sends
    bfloat16 products to oneDNN: F.linear and oneDNN timed the same there); never oneDNN off
    the CPU. Raises InvalidArgumentError for another choice, or "onednn" where it cannot run."""
    if choice is not None and choice not in CHOICES:
        raise InvalidArgumentError(f"cpu_linear must be None, {ONEDNN!r} or {TORCH!r}, got {choice!r}")
    if device.type != "cpu" or choice == TORCH or (choice is None and dtype != torch.float32):
        return TORCH
    usable = onednn_usable(dtype)
    if choice == ONEDNN and not usable:
        raise InvalidArgumentError(f"cpu_linear={ONEDNN!r}: oneDNN's inner product does not run for {dtype} with this torch "
                         f"({torch.__version__})")
    return ONEDNN if usable else TORCH


def linear_for(resolved: str):
    """The product function of a resolved choice (``resolve``)."""
    return onednn_linear if resolved == ONEDNN else torch_linear
