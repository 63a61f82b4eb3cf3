"""What this machine can do fast, to pick defaults that do not mislead benchmarks.

On CPUs without native bfloat16 matmul (no AVX-512-BF16 / AMX), torch computes a bf16
matmul of n rows at about n times the cost of one row, so prefill and multi-token verify
passes lose every advantage; float32 (MKL/oneDNN GEMM) is then the faster choice for
anything but single-token decoding. "auto" therefore means bfloat16 on CUDA and on CPUs
with native bf16, float32 elsewhere.
"""

from __future__ import annotations

from typing import Optional

import torch

_RELEVANT = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_flags() -> list[str]:
    """The CPU features that decide whether multi-row bf16/fp32 matmuls are cheap (Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [x for x in _RELEVANT if x in flags]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def auto_dtype(device: Optional[str] = None) -> str:
    """'bfloat16' on CUDA or on CPUs with native bf16 matmul, else 'float32'."""
    if (device or "cpu").startswith("cuda"):
        return "bfloat16"
    flags = cpu_flags()
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def resolve_dtype(dtype: str, device: Optional[str] = None) -> str:
    return auto_dtype(device) if dtype == "auto" else dtype


def resolve_device(device: str = "auto") -> str:
    """A device string for models and KV cache: "auto" is "cuda" when torch sees a GPU, else
    "cpu"; "cpu", "cuda" and "cuda:N" are checked against what this machine has, so that a
    request for a missing GPU fails here with a clear message instead of deep inside a load."""
    from specd.errors import InvalidArgumentError

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        if not torch.cuda.is_available():
            raise InvalidArgumentError(f"device {device!r}: torch sees no CUDA GPU on this machine "
                                       f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use 'cpu'")
        index = int(device[5:]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise InvalidArgumentError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA "
                                       f"device(s)")
        return device
    raise InvalidArgumentError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
