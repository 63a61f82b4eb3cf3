"""Custom ops of the decoder-layer kernels: ``specd::rms_norm``, ``specd::add_rms_norm``,
``specd::silu_mul`` and ``specd::rope_kv_write`` (rules: cpp/include/specd/rms_norm.h,
silu_mul.h, rope_kv_write.h).

They cut the kernels of a Llama decoder layer from about forty torch launches to nine
(models/llama.py, ``fused=True``): with q/k/v and gate/up each one matrix product, a layer is
rms_norm, qkv, rope_kv_write, tree_attention, o_proj, add_rms_norm, gate_up, silu_mul, down.
A captured draft step (engine/draft_graph.py) is then a few hundred graph nodes instead of
about a thousand, which is what its host and launch overhead scale with.

The CPU implementations are the float32 references; the CUDA kernels take float32, float16
and bfloat16 and round as torch does on tensors of that dtype.
"""

import torch

from specd import _core
from specd.ops._checks import (cache_layout, common_device, fail, index, kernel_dtype, launch,
                               no_kernel_for_device, register_kernels, rows)

__all__ = ["rms_norm", "add_rms_norm", "silu_mul", "rope_kv_write"]


def _cpu_float32_only(op: str, device: torch.device, t: torch.Tensor) -> None:
    if device.type == "cpu" and t.dtype != torch.float32:
        fail(op, f"the CPU reference is float32 only, got {t.dtype} (the CUDA kernel takes 16-bit types)")


def _norm_args(op: str, x: torch.Tensor, weight: torch.Tensor, residual=None):
    device = common_device(op, x=x, weight=weight, residual=residual)
    dtype = kernel_dtype(op, "x", x)
    _cpu_float32_only(op, device, x)
    if x.dim() != 2:
        fail(op, f"x must be [num_tokens, hidden], got shape {list(x.shape)}")
    hidden = x.shape[1]
    if weight.dtype != x.dtype or weight.shape != (hidden,):
        fail(op, f"weight must be a [{hidden}] tensor of x's dtype {x.dtype}, got {list(weight.shape)} {weight.dtype}")
    x, x_stride = rows(op, "x", x, (hidden,))
    return device, dtype, x, x_stride, weight.contiguous()


@torch.library.custom_op("specd::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm of each row of x ``[num_tokens, hidden]`` times ``weight`` ``[hidden]``
    (rms_norm.h); returns a new ``[num_tokens, hidden]`` tensor of x's dtype."""
    no_kernel_for_device("rms_norm", x, weight)


def _rms_norm(x, weight, eps):
    op = "rms_norm"
    device, dtype, x, x_stride, weight = _norm_args(op, x, weight)
    out = torch.empty(x.shape, dtype=x.dtype, device=device)
    if x.shape[0]:
        launch(device, _core.rms_norm_cpu_ptr, "rms_norm_cuda", x.data_ptr(), x_stride, 0, 0, weight.data_ptr(),
               out.data_ptr(), x.shape[1], x.shape[0], x.shape[1], float(eps), dtype)
    return out


@rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op("specd::add_rms_norm", mutates_args=("residual",))
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``residual += x`` (in x's dtype, in place) and returns the RMS norm of the new residual
    rows times ``weight`` (rms_norm.h): the decoder layer's "x = x + h; y = norm(x)".
    x, residual: ``[num_tokens, hidden]``, residual contiguous; weight ``[hidden]``."""
    no_kernel_for_device("add_rms_norm", x, residual, weight)


def _add_rms_norm(x, residual, weight, eps):
    op = "add_rms_norm"
    device, dtype, x, x_stride, weight = _norm_args(op, x, weight, residual)
    if residual.shape != x.shape or residual.dtype != x.dtype or not residual.is_contiguous():
        fail(op, f"residual must be a contiguous {list(x.shape)} tensor of x's dtype {x.dtype}, got "
                 f"{list(residual.shape)} {residual.dtype}{'' if residual.is_contiguous() else ' (not contiguous)'}")
    out = torch.empty(x.shape, dtype=x.dtype, device=device)
    if x.shape[0]:
        launch(device, _core.rms_norm_cpu_ptr, "rms_norm_cuda", x.data_ptr(), x_stride, residual.data_ptr(),
               x.shape[1], weight.data_ptr(), out.data_ptr(), x.shape[1], x.shape[0], x.shape[1], float(eps), dtype)
    return out


@add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op("specd::silu_mul", mutates_args=())
def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up = [gate | up]`` ``[num_tokens, 2 width]`` (silu_mul.h);
    returns ``[num_tokens, width]`` of its dtype."""
    no_kernel_for_device("silu_mul", gate_up)


def _silu_mul(gate_up):
    op = "silu_mul"
    device = common_device(op, gate_up=gate_up)
    dtype = kernel_dtype(op, "gate_up", gate_up)
    _cpu_float32_only(op, device, gate_up)
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        fail(op, f"gate_up must be [num_tokens, 2 * width], got shape {list(gate_up.shape)}")
    width = gate_up.shape[1] // 2
    gate_up, stride = rows(op, "gate_up", gate_up, (2 * width,))
    out = torch.empty((gate_up.shape[0], width), dtype=gate_up.dtype, device=device)
    if gate_up.shape[0] and width:
        launch(device, _core.silu_mul_cpu_ptr, "silu_mul_cuda", gate_up.data_ptr(), stride, out.data_ptr(), width,
               gate_up.shape[0], width, dtype)
    return out


@silu_mul.register_fake
def _(gate_up):
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))


@torch.library.custom_op("specd::rope_kv_write", mutates_args=("k_cache", "v_cache"))
def rope_kv_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, slot_mapping: torch.Tensor, q_heads: int) -> torch.Tensor:
    """Rotates q and k of the fused projection rows ``qkv`` ``[num_tokens, (q_heads + 2 kv_heads)
    * head_dim]`` by ``cos``/``sin`` ``[num_tokens, head_dim]`` (all of the caches' dtype), writes
    the rotated k and v to the paged caches at ``slot_mapping`` (int64 ``[num_tokens]``, -1: not
    written) and returns the rotated q ``[num_tokens, q_heads, head_dim]`` (rope_kv_write.h)."""
    no_kernel_for_device("rope_kv_write", qkv, k_cache, v_cache)


def _rope_kv_write(qkv, cos, sin, k_cache, v_cache, slot_mapping, q_heads):
    op = "rope_kv_write"
    device = common_device(op, qkv=qkv, cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    layout, _, _ = cache_layout(op, k_cache, v_cache)
    dtype = kernel_dtype(op, "qkv", qkv)
    _cpu_float32_only(op, device, qkv)
    dim = layout.head_dim
    for name, t in (("qkv", qkv), ("cos", cos), ("sin", sin)):
        if t.dtype != k_cache.dtype:
            fail(op, f"{name} must have the caches' dtype {k_cache.dtype}, got {t.dtype}")
    if q_heads < 1:
        fail(op, f"q_heads must be >= 1, got {q_heads}")
    tokens = slot_mapping.shape[0] if slot_mapping.dim() == 1 else -1
    slots = index(op, "slot_mapping", slot_mapping, torch.int64, (tokens,))
    qkv, qkv_stride = rows(op, "qkv", qkv, ((q_heads + 2 * layout.kv_heads) * dim,))
    cos, cos_stride = rows(op, "cos", cos, (dim,))
    sin, sin_stride = rows(op, "sin", sin, (dim,))
    if cos_stride != sin_stride:
        cos, sin = cos.contiguous(), sin.contiguous()
        cos_stride = dim
    if qkv.shape[0] != tokens or cos.shape[0] != tokens or sin.shape[0] != tokens:
        fail(op, f"qkv, cos and sin must have slot_mapping's {tokens} rows, got {qkv.shape[0]}, {cos.shape[0]} "
                 f"and {sin.shape[0]}")
    q = torch.empty((tokens, q_heads, dim), dtype=qkv.dtype, device=device)
    if tokens:
        launch(device, _core.rope_kv_write_cpu_ptr, "rope_kv_write_cuda", qkv.data_ptr(), qkv_stride, cos.data_ptr(),
               sin.data_ptr(), cos_stride, q.data_ptr(), q_heads * dim, q_heads, slots.data_ptr(), k_cache.data_ptr(),
               v_cache.data_ptr(), layout, tokens, dtype)
    return q


@rope_kv_write.register_fake
def _(qkv, cos, sin, k_cache, v_cache, slot_mapping, q_heads):
    return qkv.new_empty((qkv.shape[0], q_heads, k_cache.shape[-1]))


register_kernels(rms_norm, _rms_norm)
register_kernels(add_rms_norm, _add_rms_norm)
register_kernels(silu_mul, _silu_mul)
register_kernels(rope_kv_write, _rope_kv_write)
