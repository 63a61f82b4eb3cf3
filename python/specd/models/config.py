"""ModelConfig: the shape and hyper-parameters of a Llama-family model (Llama, Qwen2, Mistral).

One frozen record, read from a Hugging Face ``config.json`` (:meth:`ModelConfig.from_hf_dict`)
or from GGUF metadata (:meth:`ModelConfig.from_gguf`), validated once, so that the model code
never meets a half-filled or contradictory config. Anything specd cannot run exactly as
transformers / llama.cpp would is refused with :class:`UnsupportedModelError` naming it.

Conventions: ``head_dim`` is per head; q has ``num_attention_heads * head_dim`` rows, k and v
``num_key_value_heads * head_dim``. ``sliding_window`` is the window the reference
implementation *applies* to every layer (None = full causal attention): a Qwen2 config with
``use_sliding_window: false`` (all Qwen2.5 releases) gets None even if it states a window.
``rope_scaling`` is None for plain RoPE, or a dict with ``rope_type == "llama3"`` and its
four parameters.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional

from specd.errors import ModelLoadError, SpecdError, UnsupportedModelError
from specd.kv import kv_bytes_per_token as _kv_bytes_per_token

__all__ = ["ModelConfig", "SUPPORTED_ARCHITECTURES"]

# Hugging Face class name -> specd architecture.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
}
_ARCHES = tuple(SUPPORTED_ARCHITECTURES.values())
# transformers' defaults where a config.json leaves a key out.
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "qwen2": 32768, "mistral": 4096 * 32}
_DEFAULT_ROPE_THETA = 10000.0
_DEFAULT_RMS_EPS = 1e-6
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and hyper-parameters of one model. Construct with :meth:`from_hf_dict` or
    :meth:`from_gguf`; direct construction is validated the same way."""

    architecture: str  # "llama" | "qwen2" | "mistral"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections have biases (Qwen2); o_proj never has one
    sliding_window: Optional[int] = None
    rope_scaling: Optional[Mapping[str, Any]] = field(default=None, hash=False)
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.architecture not in _ARCHES:
            raise UnsupportedModelError(
                f"architecture {self.architecture!r} is not supported (supported: {_ARCHES})")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ModelLoadError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ModelLoadError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2 != 0:
            raise ModelLoadError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ModelLoadError(f"{name} must be a positive number, got {value!r}")
        if self.sliding_window is not None and (
                not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
            raise ModelLoadError(f"sliding_window must be a positive integer or None, "
                                 f"got {self.sliding_window!r}")
        if self.rope_scaling is not None:
            _check_llama3_rope(self.rope_scaling)
        if not isinstance(self.eos_token_ids, tuple):
            object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))
        bos = () if self.bos_token_id is None else (self.bos_token_id,)
        for name, ids in (("bos_token_id", bos), ("eos_token_ids", self.eos_token_ids)):
            for token in ids:
                if (isinstance(token, bool) or not isinstance(token, int)
                        or not 0 <= token < self.vocab_size):
                    raise ModelLoadError(f"{name} {token!r} is outside the vocabulary "
                                         f"[0, {self.vocab_size})")

    # ----------------------------------------------------------------------------- derived

    @property
    def q_size(self) -> int:
        """Rows of q_proj: ``num_attention_heads * head_dim``."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Rows of k_proj and of v_proj: ``num_key_value_heads * head_dim``."""
        return self.num_key_value_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V one token occupies over all layers (for :class:`BlockManager`)."""
        return _kv_bytes_per_token(self.num_hidden_layers, self.num_key_value_heads,
                                   self.head_dim, dtype_bytes)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight the model needs, in Hugging Face Llama naming, with its shape.
        ``lm_head.weight`` is absent when ``tie_word_embeddings``."""
        h, v = self.hidden_size, self.vocab_size
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "self_attn.q_proj.weight"] = (self.q_size, h)
            shapes[p + "self_attn.k_proj.weight"] = (self.kv_size, h)
            shapes[p + "self_attn.v_proj.weight"] = (self.kv_size, h)
            if self.attention_bias:
                shapes[p + "self_attn.q_proj.bias"] = (self.q_size,)
                shapes[p + "self_attn.k_proj.bias"] = (self.kv_size,)
                shapes[p + "self_attn.v_proj.bias"] = (self.kv_size,)
            shapes[p + "self_attn.o_proj.weight"] = (h, self.q_size)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
            shapes[p + "mlp.gate_proj.weight"] = (self.intermediate_size, h)
            shapes[p + "mlp.up_proj.weight"] = (self.intermediate_size, h)
            shapes[p + "mlp.down_proj.weight"] = (h, self.intermediate_size)
        shapes["model.norm.weight"] = (h,)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (v, h)
        return shapes

    # -------------------------------------------------------------------------- Hugging Face

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` for this model that transformers and :meth:`from_hf_dict` read
        back to the same config (used to cache GGUF models as Hugging Face directories)."""
        hf_class = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}[self.architecture]
        d: dict[str, Any] = {
            "architectures": [hf_class], "model_type": self.architecture,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "rope_theta": self.rope_theta, "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings, "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
        }
        if self.rope_scaling is not None:
            d["rope_scaling"] = dict(self.rope_scaling)
        if self.architecture == "qwen2":
            d["use_sliding_window"] = self.sliding_window is not None
            d["sliding_window"] = self.sliding_window
            d["max_window_layers"] = self.num_hidden_layers if self.sliding_window is None else 0
        elif self.architecture == "mistral":
            d["sliding_window"] = self.sliding_window
        else:
            d["attention_bias"] = False
        return d

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any],
                     generation_config: Optional[Mapping[str, Any]] = None) -> "ModelConfig":
        """From the contents of a ``config.json``. ``generation_config`` (the contents of
        ``generation_config.json``, optional) adds its ``eos_token_id`` entries, as
        transformers' ``generate`` does."""
        with _wrong_types_as_load_error("config.json"):
            return cls._parse_hf(d, generation_config)

    @classmethod
    def _parse_hf(cls, d: Mapping[str, Any],
                  generation_config: Optional[Mapping[str, Any]]) -> "ModelConfig":
        if not isinstance(d, Mapping):
            raise ModelLoadError(f"config.json must hold a JSON object, got {type(d).__name__}")
        arch = _hf_architecture(d)
        if d.get("quantization_config"):
            method = dict(d["quantization_config"]).get("quant_method", "unknown")
            raise UnsupportedModelError(f"quantized Hugging Face checkpoints are not supported "
                                        f"(quantization_config.quant_method = {method!r})")
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only 'silu')")
        if arch == "llama":
            for key in ("attention_bias", "mlp_bias"):
                if d.get(key):
                    raise UnsupportedModelError(f"Llama models with {key}=true are not supported")
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"):
            if d.get(key) is None:
                raise ModelLoadError(f"config.json has no {key!r}")
        heads = d["num_attention_heads"]
        kv_heads = d.get("num_key_value_heads") or heads
        head_dim = d.get("head_dim")
        if head_dim is None:
            if not isinstance(heads, int) or heads <= 0 or d["hidden_size"] % heads != 0:
                raise ModelLoadError(f"hidden_size ({d['hidden_size']}) must be a multiple of "
                                     f"num_attention_heads ({heads}) when head_dim is not given")
            head_dim = d["hidden_size"] // heads
        rope_theta, rope_scaling = _hf_rope(d)
        eos = _as_id_tuple(d.get("eos_token_id"), "eos_token_id")
        if generation_config:
            extra = _as_id_tuple(generation_config.get("eos_token_id"), "eos_token_id")
            eos = eos + tuple(t for t in extra if t not in eos)
        bos = d.get("bos_token_id")
        if isinstance(bos, list):
            bos = bos[0] if bos else None
        return cls(
            architecture=arch,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rope_theta=float(rope_theta),
            rms_norm_eps=float(d.get("rms_norm_eps", _DEFAULT_RMS_EPS)),
            max_position_embeddings=d.get("max_position_embeddings",
                                          _DEFAULT_MAX_POSITIONS[arch]),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2",
            sliding_window=_hf_sliding_window(d, arch),
            rope_scaling=rope_scaling,
            bos_token_id=bos,
            eos_token_ids=eos,
        )

    # ---------------------------------------------------------------------------------- GGUF

    @classmethod
    def from_gguf(cls, reader: Any) -> "ModelConfig":
        """From the metadata and tensor list of a ``gguf.GGUFReader``."""
        from specd.models.gguf_loader import config_fields_from_gguf

        with _wrong_types_as_load_error("GGUF metadata"):
            return cls(**config_fields_from_gguf(reader))


# ------------------------------------------------------------------------------- helpers

@contextmanager
def _wrong_types_as_load_error(source: str) -> Iterator[None]:
    """A value of the wrong type (a string where a number belongs...) -> ModelLoadError."""
    try:
        yield
    except SpecdError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise ModelLoadError(f"{source} has a value of the wrong type or form: {e!r}") from e


def _hf_architecture(d: Mapping[str, Any]) -> str:
    architectures = d.get("architectures") or []
    model_type = d.get("model_type")
    if architectures:
        cls_name = architectures[0]
        if cls_name not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {cls_name!r} is not supported (supported: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)})")
        arch = SUPPORTED_ARCHITECTURES[cls_name]
        if model_type is not None and model_type != arch:
            raise ModelLoadError(f"config.json is inconsistent: architectures {cls_name!r} but "
                                 f"model_type {model_type!r}")
        return arch
    if model_type in _ARCHES:
        return model_type
    raise UnsupportedModelError(f"model_type {model_type!r} is not supported (supported: "
                                f"{', '.join(_ARCHES)})")


def _hf_rope(d: Mapping[str, Any]) -> tuple[float, Optional[dict[str, Any]]]:
    """(rope_theta, rope_scaling) from transformers 5 ``rope_parameters`` or the older
    ``rope_theta`` + ``rope_scaling`` keys."""
    params = d.get("rope_parameters")
    if params is not None:
        if not isinstance(params, Mapping):
            raise ModelLoadError(f"rope_parameters must be an object, got {params!r}")
        if params and all(isinstance(v, Mapping) for v in params.values()):
            raise UnsupportedModelError("per-layer-type rope_parameters are not supported")
        theta = params.get("rope_theta", d.get("rope_theta", _DEFAULT_ROPE_THETA))
    else:
        params = d.get("rope_scaling") or {}
        if not isinstance(params, Mapping):
            raise ModelLoadError(f"rope_scaling must be an object or null, got {params!r}")
        theta = d.get("rope_theta", _DEFAULT_ROPE_THETA)
    if params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModelError("partial rotary embeddings (partial_rotary_factor != 1) "
                                    "are not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type == "llama3":
        missing = [k for k in _LLAMA3_KEYS if params.get(k) is None]
        if missing:
            raise ModelLoadError(f"rope_scaling type 'llama3' lacks {', '.join(missing)}")
        scaling = {"rope_type": "llama3", **{k: params[k] for k in _LLAMA3_KEYS}}
        _check_llama3_rope(scaling)
        return theta, scaling
    raise UnsupportedModelError(f"rope_scaling type {rope_type!r} is not supported "
                                "(supported: 'default', 'llama3')")


def _check_llama3_rope(scaling: Mapping[str, Any]) -> None:
    if scaling.get("rope_type") != "llama3":
        raise UnsupportedModelError(f"rope_scaling {dict(scaling)!r} is not supported "
                                    "(supported: None or rope_type 'llama3')")
    for k in _LLAMA3_KEYS:
        value = scaling.get(k)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ModelLoadError(f"rope_scaling.{k} must be a positive number, got {value!r}")
    if scaling["low_freq_factor"] == scaling["high_freq_factor"]:
        raise ModelLoadError("rope_scaling low_freq_factor must differ from high_freq_factor")


def _hf_sliding_window(d: Mapping[str, Any], arch: str) -> Optional[int]:
    """The window transformers applies to every layer, or None for full attention."""
    if arch == "llama":
        return None
    if arch == "mistral":
        return d.get("sliding_window", 4096)  # MistralConfig's default when the key is absent
    window = d.get("sliding_window")  # qwen2
    layer_types = d.get("layer_types")
    if layer_types is None:
        if not d.get("use_sliding_window", False) or window is None:
            return None
        first = d.get("max_window_layers", 28)
        layer_types = ["sliding_attention" if i >= first else "full_attention"
                       for i in range(d["num_hidden_layers"])]
    kinds = set(layer_types)
    if kinds <= {"full_attention"}:
        return None
    if kinds == {"sliding_attention"} and window is not None:
        return window
    raise UnsupportedModelError(f"Qwen2 sliding window on some layers only (layer_types "
                                f"{sorted(kinds)}, sliding_window {window}) is not supported")


def _as_id_tuple(value: Any, name: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, (list, tuple)) else [value]
    out: list[int] = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelLoadError(f"{name} must be an integer or a list of integers, got {value!r}")
        if v not in out:
            out.append(v)
    return tuple(out)
