"""Llama-family decoder (Llama, Qwen2 with its q/k/v biases, Mistral) written for specd's
paged KV cache: one forward runs the new tokens of many sequences (varlen), writes their
K/V into the slots the block manager handed out, and attends through block tables with
per-sequence token-tree masks (models/attention.py). Weights use Hugging Face names, so
``LlamaModel.from_loaded(load_model(path))`` serves HF directories and GGUF files alike.

Two forwards compute the same function. The torch one (the default on CPU) is a layer of
about forty small torch kernels. The fused one (``fused``, the default on CUDA when specd has
its CUDA kernels) is nine per layer: the layer-op kernels of specd.ops (RMS norm with the
residual add, the SiLU-gated product, RoPE with the KV write when the attention backend is
KernelAttention) around one matrix product each for q/k/v and for gate/up, whose weights are
concatenated once (``fuse_projections``; the separate projections' weights become views of the
concatenation, so nothing is stored twice). The two round differently in 16-bit dtypes (the
norm's sum order, one product for q/k/v instead of three), so outputs agree to rounding, not to
the bit; a model uses one forward for all its passes.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from specd.errors import InvalidArgumentError, ModelLoadError
from specd.models import cpu_linear
from specd.models.attention import AttentionBackend, AttentionMetadata, LayerKV, TorchPagedAttention
from specd.models.config import ModelConfig
from specd.models.kernel_attention import KernelAttention
from specd.models.kernel_choice import KernelChoice
from specd.models.rope import RotaryEmbedding, apply_rope
from specd.ops import host_call

_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerKV,
                meta: AttentionMetadata, backend: AttentionBackend, window: Optional[int],
                linear=cpu_linear.torch_linear) -> torch.Tensor:
        """``linear(x, layer)``: the product function (models/cpu_linear.py)."""
        t = x.shape[0]
        q = apply_rope(linear(x, self.q_proj).view(t, self.heads, self.head_dim), cos, sin)
        k = apply_rope(linear(x, self.k_proj).view(t, self.kv_heads, self.head_dim), cos, sin)
        v = linear(x, self.v_proj).view(t, self.kv_heads, self.head_dim)
        out = backend.forward(q, k, v, cache, meta, window)
        return linear(out.reshape(t, self.heads * self.head_dim), self.o_proj)

    def forward_fused(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerKV,
                      meta: AttentionMetadata, backend: AttentionBackend, window: Optional[int]) -> torch.Tensor:
        """forward with q/k/v as one product (``fuse``d weights) and, for KernelAttention on a
        cache of x's dtype, RoPE and the KV write as one kernel. cos/sin ``[T, 1, head_dim]``."""
        t = x.shape[0]
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)  # [T, (H + 2 Hkv) D]
        if isinstance(backend, KernelAttention) and window is None and cache.k.dtype == x.dtype:
            q = host_call(torch.ops.specd.rope_kv_write)(qkv, cos[:, 0], sin[:, 0], cache.k, cache.v,
                                                         meta.slot_mapping, self.heads)
            out = backend.attend(q, cache, meta)
        else:
            q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                                 self.kv_heads * self.head_dim], dim=-1)
            q = apply_rope(q.view(t, self.heads, self.head_dim), cos, sin)
            k = apply_rope(k.view(t, self.kv_heads, self.head_dim), cos, sin)
            out = backend.forward(q, k, v.view(t, self.kv_heads, self.head_dim), cache, meta, window)
        return self.o_proj(out.reshape(t, self.heads * self.head_dim))

    def fuse(self) -> None:
        """q/k/v weights (and biases) as one concatenation; the projections keep views of it."""
        self.qkv_weight, self.qkv_bias = _concat_views([self.q_proj, self.k_proj, self.v_proj])


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, linear=cpu_linear.torch_linear) -> torch.Tensor:
        return linear(F.silu(linear(x, self.gate_proj)) * linear(x, self.up_proj), self.down_proj)

    def forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(host_call(torch.ops.specd.silu_mul)(F.linear(x, self.gate_up_weight)))

    def fuse(self) -> None:
        self.gate_up_weight, _ = _concat_views([self.gate_proj, self.up_proj])


def _concat_views(linears: list[nn.Linear]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The linears' weights (and biases, if any) concatenated along the output dimension; each
    linear's parameters are replaced by views of the concatenation (same values, no copy kept)."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    bias = None if linears[0].bias is None else torch.cat([lin.bias.detach() for lin in linears])
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[start:start + rows], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start:start + rows], requires_grad=False)
        start += rows
    return weight, bias


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)


class _Backbone(nn.Module):  # "model." prefix of the HF names
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LlamaModel(nn.Module):
    """The decoder and its LM head. ``forward`` returns float32 logits of the rows asked for."""

    def __init__(self, config: ModelConfig, backend: Optional[AttentionBackend] = None):
        super().__init__()
        self.config = config
        self.model = _Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.backend = backend or TorchPagedAttention()
        self.rope: Optional[RotaryEmbedding] = None
        # Hugging Face applies Mistral's sliding window; Qwen2 only with use_sliding_window.
        self.window = config.sliding_window if config.architecture == "mistral" else None
        #: Which forward runs (module doc): True the fused one, False the torch one, None the
        #: fused one on CUDA when specd has its CUDA kernels.
        self.fused: Optional[bool] = None
        #: Which CUDA kernel variants this model's kernel paths take (models/kernel_choice.py;
        #: LLM's ``kernels``): its kernel-attention forwards and, as a draft, its sampled rows.
        self.kernels = KernelChoice()
        #: The products of the torch forward (models/cpu_linear.py): "onednn", "torch", or None
        #: (default): oneDNN's inner product for float32 on the CPU where it runs, F.linear
        #: otherwise.
        self.cpu_linear: Optional[str] = None
        #: The dtype of the logits forward returns (``logits_dtype``); None: the default rule.
        self.logits_dtype_override: Optional[torch.dtype] = None
        self._linear_key: Optional[tuple] = None  # (device, dtype, cpu_linear) _linear was resolved for
        self._linear = cpu_linear.torch_linear
        self._fused_key: Optional[tuple] = None  # what fuse_projections last concatenated

    @classmethod
    def from_loaded(cls, loaded, device: str | torch.device = "cpu",
                    backend: Optional[AttentionBackend] = None) -> "LlamaModel":
        """A model holding ``loaded.weights`` (specd.models.LoadedModel), in their dtype."""
        dtype = next(iter(loaded.weights.values())).dtype
        with torch.device("meta"):
            model = cls(loaded.config, backend)
        expected = set(model.state_dict().keys())
        if loaded.config.tie_word_embeddings:
            expected.discard("lm_head.weight")
        missing = sorted(expected - set(loaded.weights))
        if missing:
            raise ModelLoadError(f"{loaded.source}: weights missing for {missing[:5]}"
                                 f"{' and more' if len(missing) > 5 else ''}")
        model.load_state_dict(loaded.weights, strict=False, assign=True)
        if loaded.config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        return model.to(device=device, dtype=dtype).eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def logits_dtype(self) -> torch.dtype:
        """The dtype of the logits ``forward`` returns (``logits_dtype_override`` when set).
        On the CPU float32: numpy reads float32 rows in place (the greedy argmax), and a float32
        model computes them so anyway. Elsewhere the model's dtype, in which the LM head
        computes them: a float32 copy would have the same values, written once more and read at
        twice the bytes by every consumer (argmax, sampling, verification: their kernels take
        float16 and bfloat16 rows and give the same results as for those values in float32)."""
        if self.logits_dtype_override is not None:
            return self.logits_dtype_override
        return torch.float32 if self.device.type == "cpu" else self.dtype

    def linear_fn(self):
        """The torch forward's product function ``linear(x, layer)`` (``cpu_linear``, resolved
        once per device, dtype and choice; models/cpu_linear.py)."""
        key = (self.device, self.dtype, self.cpu_linear)
        if self._linear_key != key:
            self._linear = cpu_linear.linear_for(cpu_linear.resolve(self.cpu_linear, self.device, self.dtype))
            self._linear_key = key
        return self._linear

    def uses_fused(self) -> bool:
        """Whether forward runs the fused layer kernels (``fused``, module doc)."""
        if self.fused is not None:
            return self.fused
        import specd.ops as ops

        return self.device.type == "cuda" and ops.HAS_CUDA_KERNELS and self.dtype in _FUSED_DTYPES

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """Concatenates q/k/v and gate/up weights of every layer for the fused forward (done by
        the first fused forward, and again whenever the weights were replaced or moved). Not
        during CUDA graph capture: the first fused forward must run eagerly (the graph runners
        warm up before they capture). Likewise before torch.compile: a compiled forward does
        not check the weights (a replaced weight needs a new eager forward first)."""
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise InvalidArgumentError("fuse_projections during CUDA graph capture: run a fused forward eagerly first")
        with torch.inference_mode(False):  # normal tensors: the weights stay loadable in place
            for layer in self.model.layers:
                layer.self_attn.fuse()
                layer.mlp.fuse()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the old weights' memory is free only after the copies
        self._fused_key = self._projection_key()

    def _projection_key(self) -> tuple:
        first = self.model.layers[0]
        return (first.self_attn.q_proj.weight.data_ptr(), first.mlp.gate_proj.weight.data_ptr(), self.dtype)

    # no_grad, not inference_mode: torch.compile cannot take inference tensors made outside
    # the compiled code (such as the rotary table built by a first eager forward).
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata, kv: list[LayerKV],
                logits_indices: Optional[torch.Tensor] = None,
                backend: Optional[AttentionBackend] = None,
                logits_out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """input_ids int64 ``[T]``; kv: one LayerKV per layer; logits_indices ``[N]`` (None: all
        tokens) -> logits ``[N, vocab]`` in ``logits_dtype`` (float32 on the CPU, the model's
        dtype on a GPU). ``backend`` overrides the model's attention backend for this call (the
        draft graph passes KernelAttention with its device-only metadata,
        models/kernel_attention.py); ``meta`` is whatever that backend reads, plus
        ``positions``. ``logits_out``: ``[N, vocab]`` of ``logits_dtype`` the logits are written
        to (and returned), in place of a new tensor (the target graph's shared output buffer)."""
        backend = self.backend if backend is None else backend
        c = self.config
        if self.rope is None or self.rope.inv_freq.device != self.device:
            self.rope = RotaryEmbedding(c.head_dim, c.rope_theta, c.rope_scaling, self.device)
        cos, sin = self.rope.cos_sin(meta.positions, self.dtype)
        x = self.model.embed_tokens(input_ids)
        if self.uses_fused():
            logits = self._forward_fused(x, cos, sin, meta, kv, logits_indices, backend)
            return logits.to(self.logits_dtype) if logits_out is None else logits_out.copy_(logits)
        linear = self.linear_fn()
        for layer, cache in zip(self.model.layers, kv):
            h = layer.self_attn(layer.input_layernorm(x), cos, sin, cache, meta, backend, self.window, linear)
            x = x + h
            x = x + layer.mlp(layer.post_attention_layernorm(x), linear)
        if logits_indices is not None:
            x = x[logits_indices]
        logits = linear(self.model.norm(x), self.lm_head)
        return logits.to(self.logits_dtype) if logits_out is None else logits_out.copy_(logits)

    def _forward_fused(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata,
                       kv: list[LayerKV], logits_indices: Optional[torch.Tensor],
                       backend: AttentionBackend) -> torch.Tensor:
        """The fused forward (module doc) from the embeddings x ``[T, hidden]``; returns the
        LM head's output in the model's dtype. x is the residual stream, updated in place."""
        # (Not while torch.compile traces: it cannot compare data pointers. As before a graph
        # capture, a fused forward must have run eagerly first; fuse_projections' doc.)
        if torch.compiler.is_compiling():
            if self._fused_key is None:
                raise InvalidArgumentError("torch.compile of a fused forward: run one fused forward eagerly "
                                           "first (it concatenates the q/k/v and gate/up weights)")
        elif self._fused_key != self._projection_key():
            self.fuse_projections()
        rms_norm, add_rms_norm = host_call(torch.ops.specd.rms_norm), host_call(torch.ops.specd.add_rms_norm)
        layers = self.model.layers
        h = rms_norm(x, layers[0].input_layernorm.weight, layers[0].input_layernorm.eps) if len(layers) else x
        out = None
        for i, (layer, cache) in enumerate(zip(layers, kv)):
            if i > 0:
                norm = layer.input_layernorm
                h = add_rms_norm(out, x, norm.weight, norm.eps)
            attn = layer.self_attn.forward_fused(h, cos, sin, cache, meta, backend, self.window)
            norm = layer.post_attention_layernorm
            h = add_rms_norm(attn, x, norm.weight, norm.eps)
            out = layer.mlp.forward_fused(h)
        if out is None:  # no layers
            out = torch.zeros_like(x)
        if logits_indices is not None:
            out, x = out[logits_indices], x[logits_indices]
        return self.lm_head(add_rms_norm(out, x, self.model.norm.weight, self.model.norm.eps))
