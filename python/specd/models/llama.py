"""Llama-family decoder (Llama, Qwen2 with its q/k/v biases, Mistral) written for specd's
paged KV cache: one forward runs the new tokens of many sequences (varlen), writes their
K/V into the slots the block manager handed out, and attends through block tables with
per-sequence token-tree masks (models/attention.py). Weights use Hugging Face names, so
``LlamaModel.from_loaded(load_model(path))`` serves HF directories and GGUF files alike.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from specd.errors import ModelLoadError
from specd.models.attention import AttentionBackend, AttentionMetadata, LayerKV, TorchPagedAttention
from specd.models.config import ModelConfig
from specd.models.rope import RotaryEmbedding, apply_rope


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
                meta: AttentionMetadata, backend: AttentionBackend, window: Optional[int]) -> torch.Tensor:
        t = x.shape[0]
        q = apply_rope(self.q_proj(x).view(t, self.heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(t, self.kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(t, self.kv_heads, self.head_dim)
        out = backend.forward(q, k, v, cache, meta, window)
        return self.o_proj(out.reshape(t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata, kv: list[LayerKV],
                logits_indices: Optional[torch.Tensor] = None,
                backend: Optional[AttentionBackend] = None,
                logits_out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """input_ids int64 ``[T]``; kv: one LayerKV per layer; logits_indices ``[N]`` (None: all
        tokens) -> float32 logits ``[N, vocab]``. ``backend`` overrides the model's attention
        backend for this call (the draft graph passes KernelAttention with its device-only
        metadata, models/kernel_attention.py); ``meta`` is whatever that backend reads, plus
        ``positions``. ``logits_out``: float32 ``[N, vocab]`` the logits are written to (and
        returned), in place of a new tensor (the target graph's shared output buffer)."""
        backend = self.backend if backend is None else backend
        c = self.config
        if self.rope is None or self.rope.inv_freq.device != self.device:
            self.rope = RotaryEmbedding(c.head_dim, c.rope_theta, c.rope_scaling, self.device)
        cos, sin = self.rope.cos_sin(meta.positions, self.dtype)
        x = self.model.embed_tokens(input_ids)
        for layer, cache in zip(self.model.layers, kv):
            h = layer.self_attn(layer.input_layernorm(x), cos, sin, cache, meta, backend, self.window)
            x = x + h
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if logits_indices is not None:
            x = x[logits_indices]
        logits = self.lm_head(self.model.norm(x))
        return logits.float() if logits_out is None else logits_out.copy_(logits)
