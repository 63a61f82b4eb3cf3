"""Argument checks and kernel launching shared by the custom ops of specd.ops.

Every op checks the metadata of its tensors here (device, dtype, rank, inner contiguity) and
raises :class:`~specd.errors.InvalidArgumentError` naming the op and the argument; contents are
the kernels' business (they never sync to inspect them). ``launch`` then calls the CPU
reference on host pointers (``_core.*_cpu_ptr`` / ``*_batch_cpu``) or the CUDA launcher on
device pointers and the current stream: the same argument list for both devices.
"""

from typing import Callable, NoReturn, Optional

import torch

from specd import _core
from specd.errors import InvalidArgumentError

#: Whether this build of specd._core has the CUDA kernels (the CUDA implementations of the ops
#: are registered only then; without them, CUDA tensors get a clear error).
HAS_CUDA_KERNELS = bool(getattr(_core, "built_with_cuda", False))

#: torch dtype -> the dtype name the launchers take (KvDtype / LogitsDtype).
KERNEL_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def fail(op: str, message: str) -> NoReturn:
    raise InvalidArgumentError(f"specd.{op}: {message}")


def no_kernel_for_device(op: str, *tensors: Optional[torch.Tensor]) -> NoReturn:
    """The default implementation of every op: reached only for devices without a kernel."""
    no_kernel_on(op, next((t.device for t in tensors if isinstance(t, torch.Tensor)), None))


def no_kernel_on(op: str, device: Optional[torch.device]) -> NoReturn:
    if device is not None and device.type == "cuda":
        fail(op, "this specd build has no CUDA kernels (built without nvcc); pass CPU tensors or "
                 "rebuild with SPECD_CUDA=ON")
    fail(op, f"supports cpu and cuda tensors, not {device}")


def common_device(op: str, **tensors: Optional[torch.Tensor]) -> torch.device:
    """The one device of all given tensors (None entries are skipped)."""
    device, first = None, None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            fail(op, f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            fail(op, f"{name} is on {t.device} but {first} is on {device}: all tensors must be on one device")
    return device


def expect(op: str, name: str, t: torch.Tensor, dtype: torch.dtype, ndim: int) -> None:
    if t.dtype != dtype:
        fail(op, f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != ndim:
        fail(op, f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")


def expect_shape(op: str, name: str, t: torch.Tensor, shape: tuple) -> None:
    """shape entries of -1 match any size."""
    if t.dim() != len(shape) or any(want >= 0 and got != want for got, want in zip(t.shape, shape)):
        want = ", ".join("*" if s < 0 else str(s) for s in shape)
        fail(op, f"{name} must have shape [{want}], got {list(t.shape)}")


def index(op: str, name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """An integer index tensor, checked, made contiguous (a copy only if it was not)."""
    expect(op, name, t, dtype, len(shape))
    expect_shape(op, name, t, shape)
    return t.contiguous()


def kernel_dtype(op: str, name: str, t: torch.Tensor) -> str:
    if t.dtype not in KERNEL_DTYPES:
        fail(op, f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
    return KERNEL_DTYPES[t.dtype]


def rows(op: str, name: str, t: torch.Tensor, inner: tuple) -> tuple[torch.Tensor, int]:
    """A ``[n, *inner]`` tensor whose rows are contiguous (the token stride may be anything):
    returns it (copied only if a row is not contiguous) and its row stride in elements."""
    expect_shape(op, name, t, (-1, *inner))
    row = 1
    for size in inner:
        row *= size
    if not _inner_contiguous(t) or (t.shape[0] > 1 and t.stride(0) < row):
        t = t.contiguous()
    return t, (t.stride(0) if t.shape[0] > 1 else row)


def _inner_contiguous(t: torch.Tensor) -> bool:
    expected = 1
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def cache_layout(op: str, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 ndims: tuple = (4,)) -> tuple[object, int, int]:
    """Checks a K/V cache pair ``[(num_layers,) num_pages, block_size, kv_heads, head_dim]``
    (pages and layers may be strided, token rows contiguous) and returns
    (``_core.PagedKvLayout``, num_layers, layer_stride). The caches are never copied: the
    kernels write them in place."""
    if k_cache.dim() not in ndims:
        fail(op, f"k_cache must have {' or '.join(map(str, ndims))} dimensions, got shape {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride() or v_cache.dtype != k_cache.dtype:
        fail(op, f"v_cache must have k_cache's shape, strides and dtype; got {tuple(v_cache.shape)} "
                 f"{v_cache.stride()} {v_cache.dtype} vs {tuple(k_cache.shape)} {k_cache.stride()} {k_cache.dtype}")
    kernel_dtype(op, "k_cache", k_cache)
    pages, block, heads, dim = k_cache.shape[-4:]
    if k_cache.stride()[-3:] != (heads * dim, dim, 1):
        fail(op, "the caches' token rows [block_size, kv_heads, head_dim] must be contiguous within a page; "
                 f"got strides {k_cache.stride()}")
    page_stride = k_cache.stride(-4) if pages > 1 else block * heads * dim
    layers = k_cache.shape[0] if k_cache.dim() == 5 else 1
    layer_stride = k_cache.stride(0) if k_cache.dim() == 5 and layers > 1 else pages * page_stride
    layout = _core.PagedKvLayout(int(pages), int(block), int(heads), int(dim), int(page_stride))
    return layout, int(layers), int(layer_stride)


def launch(device: torch.device, cpu: Callable, cuda_name: str, *args, **cuda_options) -> None:
    """Runs ``cpu(*args)`` for CPU tensors, else ``_core.<cuda_name>(*args, stream,
    **cuda_options)`` on the current CUDA stream of ``device`` (asynchronous; no host sync)."""
    if device.type == "cpu":
        cpu(*args)
        return
    if device.type != "cuda" or not HAS_CUDA_KERNELS:  # (host_call reaches here without the dispatcher)
        no_kernel_on(cuda_name.removesuffix("_cuda"), device)
    getattr(_core, cuda_name)(*args, torch.cuda.current_stream(device).cuda_stream, **cuda_options)


def register_kernels(op, impl: Callable) -> None:
    """Registers ``impl`` as the op's CPU kernel and, in builds with the CUDA kernels, as its
    CUDA kernel (``impl`` picks the launcher by the tensors' device). In those builds it also
    becomes what ``host_call(op)`` returns."""
    op.register_kernel("cpu")(impl)
    if HAS_CUDA_KERNELS:
        op.register_kernel("cuda")(impl)
        op.specd_impl = impl
        getattr(torch.ops.specd, op._name).specd_impl = impl  # what torch code calls: torch.ops.specd.<name>


def host_call(op: Callable) -> Callable:
    """What eager host code calls for ``op``: the function registered as its CPU and CUDA
    kernel, which skips torch's dispatcher. That saves 20-25 µs of host time per call
    (measured on the CPU, per op of tests/python/test_ops.py's samples). Eager inference needs
    nothing the dispatcher adds (autograd, tracing, fake tensors).

    ``op``: a specd op (``specd.ops.<name>`` or ``torch.ops.specd.<name>``). Returns ``op``
    itself in three cases: under torch.compile; in builds without the CUDA kernels (where the
    op's own error names a CUDA tensor); and for anything that is not a specd op (a test's
    stand-in)."""
    impl = getattr(op, "specd_impl", None)
    if impl is None or torch.compiler.is_compiling():
        return op
    return impl
