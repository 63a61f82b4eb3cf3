"""Reading a GGUF file (llama.cpp's format) into Hugging Face-named torch weights.

The file is opened with ``gguf.GGUFReader`` (a memory map: nothing is read until a tensor is
converted). Tensors are dequantized one at a time with ``gguf.quants.dequantize`` and cast to
the requested dtype, so peak memory stays near one float32 tensor plus the result.

Two conventions of llama.cpp's converter are undone here:
- GGUF lists a tensor's dims innermost first: a ``[out, in]`` weight is stored as ``[in, out]``.
- For the "llama" architecture (Llama and Mistral) the converter permutes the rows of the q and
  k projections into its rotary layout (``LlamaModel.permute`` in convert_hf_to_gguf.py);
  :func:`reverse_permute` restores Hugging Face's order, as transformers' GGUF loader does.
  Qwen2 files are not permuted.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

import numpy as np
import torch

from specd.errors import ModelLoadError, UnsupportedModelError

__all__ = ["open_gguf", "config_fields_from_gguf", "hf_name", "reverse_permute",
           "load_gguf_weights", "SUPPORTED_GGML_TYPES"]

# The types specd loads: float, legacy and K-quants, and IQ4_NL (llama.cpp's fallback for
# rows that are not a multiple of 256 in low-bit K-quant files). Others (IQ2/IQ3, TQ*,
# MXFP4, integer types...) are refused by name rather than dequantized by untested paths.
SUPPORTED_GGML_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL")

_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
_REQUIRED = object()  # sentinel: a metadata key without a default
_DEFAULT_ROPE_THETA = 10000.0  # llama.cpp's default when rope.freq_base is absent


def open_gguf(path: str) -> Any:
    """A ``gguf.GGUFReader`` on ``path``; a missing, truncated or corrupt file -> ModelLoadError."""
    try:
        import gguf
    except ImportError as e:
        raise ModelLoadError("loading GGUF files needs the 'gguf' package (pip install gguf)") from e
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # numpy/struct/key errors from a damaged header or a cut file
        raise ModelLoadError(f"{path}: not a readable GGUF file (truncated or corrupt?): "
                             f"{type(e).__name__}: {e}") from e
    count = _gguf_value(reader, "split.count")
    if count is not None and int(count) > 1:
        raise UnsupportedModelError(f"{path} is part 1 of a {count}-part split GGUF; merge the "
                                    "parts into one file first (llama-gguf-split --merge)")
    return reader


def hf_name(gguf_name: str) -> Optional[str]:
    """The Hugging Face Llama name of a llama.cpp tensor name, or None if it has none."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        return None
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"


def reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: rows grouped ``[n_head, head_dim/2, 2]`` in the
    file go back to Hugging Face's ``[n_head, 2, head_dim/2]`` (``n_head`` = kv heads for k).
    ``w``: ``[n_head * head_dim, ...]``."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def config_fields_from_gguf(reader: Any) -> dict[str, Any]:
    """The :class:`ModelConfig` fields stated by a GGUF file's metadata and tensor list."""
    gguf_arch = _gguf_value(reader, "general.architecture")
    if gguf_arch not in ("llama", "qwen2"):
        raise UnsupportedModelError(
            f"GGUF architecture {gguf_arch!r} is not supported (supported: 'llama', 'qwen2'; "
            "llama.cpp writes Mistral models as 'llama')")
    arch = gguf_arch
    name = _gguf_value(reader, "general.name")
    if gguf_arch == "llama" and isinstance(name, str) and "mistral" in name.lower():
        arch = "mistral"  # what transformers' GGUF loader does too

    def key(suffix: str, default: Any = _REQUIRED) -> Any:
        value = _gguf_value(reader, f"{gguf_arch}.{suffix}")
        if value is None:
            if default is _REQUIRED:
                raise ModelLoadError(f"GGUF metadata has no {gguf_arch}.{suffix}")
            return default
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise UnsupportedModelError(f"GGUF {gguf_arch}.{suffix} varies per layer "
                                            f"({value[:8]}...), which is not supported")
            value = value[0]
        return value

    scaling = key("rope.scaling.type", "none")
    if scaling != "none":
        raise UnsupportedModelError(f"rope_scaling type {scaling!r} (GGUF "
                                    f"{gguf_arch}.rope.scaling.type) is not supported")
    tensors = {t.name: t for t in reader.tensors}
    if "rope_freqs.weight" in tensors:
        raise UnsupportedModelError("GGUF rope_freqs.weight (llama3 rope scaling stored as "
                                    "per-dimension factors) is not supported")
    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    kv_heads = int(key("attention.head_count_kv", heads))
    head_dim = key("attention.key_length", None)
    if head_dim is None:
        if heads <= 0 or hidden % heads != 0:
            raise ModelLoadError(f"GGUF embedding_length ({hidden}) is not a multiple of "
                                 f"attention.head_count ({heads})")
        head_dim = hidden // heads
    if key("attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError("GGUF attention.value_length != key_length is not supported")
    rope_dims = key("rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise UnsupportedModelError(f"partial rotary embeddings (rope.dimension_count "
                                    f"{rope_dims} != head_dim {head_dim}) are not supported")
    embd = tensors.get("token_embd.weight")
    if embd is not None and len(embd.shape) == 2:
        vocab = int(embd.shape[1])  # dims innermost first: [hidden, vocab]
    else:
        vocab = key("vocab_size", None)
        if vocab is None:
            tokens = _gguf_value(reader, "tokenizer.ggml.tokens")
            vocab = len(tokens) if tokens else None
        if vocab is None:
            raise ModelLoadError("GGUF file has neither token_embd.weight nor a token list "
                                 "to tell the vocabulary size")
    eos: list[int] = []
    for k in ("eos_token_id", "eot_token_id", "eom_token_id"):
        token = _gguf_value(reader, f"tokenizer.ggml.{k}")
        if token is not None and int(token) not in eos:
            eos.append(int(token))
    bos = _gguf_value(reader, "tokenizer.ggml.bos_token_id")
    return dict(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=int(head_dim),
        rope_theta=_decimal_of_f32(key("rope.freq_base", _DEFAULT_ROPE_THETA)),
        rms_norm_eps=_decimal_of_f32(key("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias=arch == "qwen2",
        sliding_window=None,  # llama.cpp applies none for these architectures
        rope_scaling=None,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=tuple(eos),
    )


def _decimal_of_f32(value: Any) -> float:
    """The shortest decimal that rounds to this float32: GGUF stores 1e-6 as float32
    9.99999997e-07, and we want back the 1e-6 the config.json of the same model says."""
    return float(str(np.float32(value)))


def load_gguf_weights(reader: Any, config: Any, dtype: torch.dtype, *, source: str,
                      progress: bool = False) -> dict[str, torch.Tensor]:
    """All weights of the GGUF file, in Hugging Face naming and ``[out, in]`` layout, as CPU
    tensors of ``dtype``. Every tensor's name, type and shape is checked against ``config``
    before any is converted."""
    import gguf

    expected = config.weight_shapes()
    plan: list[tuple[Any, str]] = []
    unexpected: list[str] = []
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None or name not in expected:
            unexpected.append(t.name)
            continue
        type_name = t.tensor_type.name
        if type_name not in SUPPORTED_GGML_TYPES:
            raise UnsupportedModelError(
                f"{source}: tensor {t.name} has GGML type {type_name}, which specd does not "
                f"load (supported: {', '.join(SUPPORTED_GGML_TYPES)})")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if shape != expected[name]:
            raise ModelLoadError(f"{source}: tensor {t.name} ({name}) has shape {shape}, "
                                 f"expected {expected[name]} from the model's metadata")
        plan.append((t, name))
    if unexpected:
        raise ModelLoadError(f"{source}: unexpected tensors for a {config.architecture} model "
                             f"with {config.num_hidden_layers} layers: "
                             f"{', '.join(unexpected[:5])}{' ...' if len(unexpected) > 5 else ''}")
    missing = sorted(set(expected) - {name for _, name in plan})
    if missing:
        raise ModelLoadError(f"{source}: missing tensors {', '.join(missing[:5])}"
                             f"{' ...' if len(missing) > 5 else ''}")

    permuted = config.architecture in ("llama", "mistral")
    weights: dict[str, torch.Tensor] = {}
    for t, name in _progress(plan, progress, os.path.basename(source)):
        try:
            values = gguf.quants.dequantize(t.data, t.tensor_type)  # float32
        except Exception as e:
            raise ModelLoadError(f"{source}: cannot dequantize tensor {t.name} "
                                 f"({t.tensor_type.name}): {e}") from e
        values = values.reshape(expected[name])
        if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
            values = reverse_permute(values, config.num_attention_heads)
        elif permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
            values = reverse_permute(values, config.num_key_value_heads)
        weights[name] = _to_tensor(values, dtype)
    return weights


def _to_tensor(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A fresh CPU tensor of ``dtype`` (never a view of the memory-mapped file)."""
    if not values.flags.writeable or not values.flags.c_contiguous:
        values = np.array(values, dtype=np.float32, order="C")  # F32 tensors are file views
    return torch.from_numpy(values).to(dtype).contiguous()


def _progress(items: list, enabled: bool, label: str) -> Any:
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=f"loading {label}", unit="tensor")


def _gguf_value(reader: Any, key: str) -> Any:
    """The value of one GGUF metadata key (a list for arrays), or None when absent."""
    f = reader.get_field(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception as e:  # a malformed field: bad UTF-8, wrong type
        raise ModelLoadError(f"GGUF metadata {key!r} is unreadable: {e}") from e
