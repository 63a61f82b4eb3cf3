"""Build tiny test models and tokenizers on disk (no downloads, a few seconds in all).

- :func:`make_tokenizer` trains a byte-level BPE on a few standard-library sources and saves
  it as a transformers tokenizer (``tokenizer.json`` + ``tokenizer_config.json``). It splits
  text with Qwen2's pre-tokenizer regex, so transformers loads it to the same ids whether it
  keeps the saved pre-tokenizer (Llama, Mistral), swaps in Qwen2's own (``Qwen2Tokenizer``)
  or rebuilds it from GGUF metadata (``tokenizer.ggml.pre = "qwen2"``).
- :func:`make_tiny_model` saves a random-weight ``LlamaForCausalLM`` /
  ``Qwen2ForCausalLM`` / ``MistralForCausalLM`` with ``save_pretrained`` (safetensors) and
  the tokenizer beside it. Every parameter is random (norm weights near 1, biases nonzero),
  so a weight loaded under a wrong name or in a wrong row order is visible.
- :func:`write_gguf` writes such a model as a GGUF file the way llama.cpp's converter does
  (llama.cpp tensor names, q/k rows permuted for llama/mistral, metadata for the config and
  the tokenizer), in F32, F16, BF16 or a type gguf-py can quantize (Q8_0, Q4_0, ...).
- :func:`random_quant_blocks` makes well-formed raw blocks of any quantized type (finite
  scales), for types gguf-py cannot quantize (Q4_K, Q5_K, Q6_K).

Random models have flat logits (std ~0.2); ``lm_head_scale=10`` makes them peaky.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import numpy as np
import torch

PathLike = Union[str, "os.PathLike[str]"]

EOS_TOKEN = "<|endoftext|>"
EOS_TOKEN_ID = 0  # the first special token of the trainer gets id 0
DEFAULT_VOCAB_SIZE = 384
# Small, stable files present in every CPython installation.
_CORPUS_FILES = ("textwrap.py", "string.py", "bisect.py", "keyword.py", "colorsys.py")

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "mistral": "MistralForCausalLM"}
CODE_SNIPPET = ("def fibonacci(n: int) -> int:\n"
                "    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
                "    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)  # 12345 é\n")


def stdlib_corpus_files() -> list[str]:
    """Paths of a few standard-library sources, found from ``os.__file__``."""
    stdlib = os.path.dirname(os.__file__)
    files = [os.path.join(stdlib, name) for name in _CORPUS_FILES]
    return [f for f in files if os.path.isfile(f)]


def make_tokenizer(out_dir: PathLike, vocab_size: int = DEFAULT_VOCAB_SIZE) -> Any:
    """Train a byte-level BPE with ``vocab_size`` entries (``<|endoftext|>`` = id 0 is bos and
    eos), save it in ``out_dir`` and return it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train(stdlib_corpus_files(), trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"trained {tok.get_vocab_size()} tokens, wanted {vocab_size}: "
                           "the corpus is too small for this vocabulary")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS_TOKEN, eos_token=EOS_TOKEN)
    fast.save_pretrained(str(out_dir))
    return fast


def _copy_tokenizer(tokenizer_dir: PathLike, out_dir: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out_dir / name).write_bytes((Path(tokenizer_dir) / name).read_bytes())


def hf_config(architecture: str, vocab_size: int, hidden_size: int = 64, layers: int = 2,
              heads: int = 4, kv_heads: int = 2, intermediate: int = 128, tie: bool = False,
              **overrides: Any) -> Any:
    """A transformers config for a tiny model (bos = eos = 0, rope theta 10000, 512 positions)."""
    import transformers

    classes = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "mistral": transformers.MistralConfig}
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=tie,
        bos_token_id=EOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID,
        architectures=[ARCHITECTURES[architecture]])
    if architecture == "mistral":
        kwargs["sliding_window"] = None  # GGUF (llama arch) cannot express one
    kwargs.update(overrides)
    return classes[architecture](**kwargs)


def make_tiny_model(out_dir: PathLike, architecture: str = "llama",
                    vocab_size: int = DEFAULT_VOCAB_SIZE, hidden_size: int = 64, layers: int = 2,
                    heads: int = 4, kv_heads: int = 2, intermediate: int = 128,
                    tie: bool = False, lm_head_scale: float = 1.0, seed: int = 0,
                    tokenizer_dir: Optional[PathLike] = None,
                    max_shard_size: Optional[str] = None, **config_overrides: Any) -> Any:
    """Save a random tiny model in ``out_dir`` (safetensors, sharded when ``max_shard_size``
    is given, e.g. ``"20KB"``) with a tokenizer and return the transformers model (float32).

    ``tokenizer_dir``: a directory made by :func:`make_tokenizer` to copy; by default a
    tokenizer is trained into ``out_dir``. ``lm_head_scale`` multiplies ``lm_head`` (the
    embedding when ``tie``). The global torch RNG is left untouched.
    """
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(architecture, vocab_size, hidden_size, layers, heads, kv_heads,
                       intermediate, tie, **config_overrides)
    classes = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
               "mistral": transformers.MistralForCausalLM}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = classes[architecture](config).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
                else:
                    p.copy_(0.02 * torch.randn_like(p))
            model.lm_head.weight.mul_(lm_head_scale)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # "Writing model shards" noise
    try:
        model.save_pretrained(str(out), **kwargs)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    if tokenizer_dir is None:
        make_tokenizer(out, vocab_size=min(vocab_size, DEFAULT_VOCAB_SIZE))
    else:
        _copy_tokenizer(tokenizer_dir, out)
    return model


def load_hf_model(model_dir: PathLike, dtype: torch.dtype = torch.float32) -> Any:
    """The transformers model saved in ``model_dir`` (a reference to compare specd with)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()


# ---------------------------------------------------------------------------------------- GGUF

def llama_cpp_permute(w: np.ndarray, n_head: int, n_head_kv: Optional[int] = None) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (convert_hf_to_gguf.py): q/k rows to its rope layout."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
                 "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str) -> str:
    """llama.cpp's name of a Hugging Face Llama-family tensor name."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    parts = hf_name.split(".", 3)  # model, layers, i, rest
    return f"blk.{parts[2]}.{_LAYER_NAMES[parts[3]]}"


def read_hf_state_dict(model_dir: PathLike) -> dict[str, torch.Tensor]:
    """All tensors of the safetensors files in ``model_dir`` (single or sharded)."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def random_quant_blocks(qtype: Any, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """Random raw bytes of a ``[rows, cols]`` tensor of quantized ``qtype`` (a
    ``gguf.GGMLQuantizationType``) with every fp16 scale finite and small, so that
    ``gguf.quants.dequantize`` gives finite values. Returns uint8 ``[rows, bytes_per_row]``."""
    import gguf

    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    if cols % block:
        raise ValueError(f"{qtype.name} needs rows of a multiple of {block} values, got {cols}")
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // block, type_size), dtype=np.uint8)
    # The fp16 scales of each block: where they sit in the block layout.
    scale_bytes = {"Q4_K": (0, 4), "Q5_K": (0, 4), "Q2_K": (type_size - 4, type_size),
                   "Q6_K": (type_size - 2, type_size), "Q3_K": (type_size - 2, type_size),
                   "Q8_0": (0, 2), "Q4_0": (0, 2), "IQ4_NL": (0, 2), "Q5_0": (0, 2), "Q4_1": (0, 4), "Q5_1": (0, 4)}
    if qtype.name not in scale_bytes:
        return raw.reshape(rows, -1)
    lo, hi = scale_bytes[qtype.name]
    scales = rng.uniform(1e-3, 1e-2, size=(rows, cols // block, (hi - lo) // 2)).astype(np.float16)
    raw[:, :, lo:hi] = scales.view(np.uint8)
    return raw.reshape(rows, -1)


def write_gguf(model_dir: PathLike, path: PathLike, qtype: str = "F32", *,
               name: Optional[str] = None, architecture: Optional[str] = None,
               tensors: Optional[Mapping[str, tuple[np.ndarray, Any]]] = None,
               extra_metadata: Optional[Mapping[str, Any]] = None) -> Path:
    """Write the model saved in ``model_dir`` as a GGUF file at ``path``, like llama.cpp.

    qtype: type of the 2-D weights: "F32", "F16", "BF16" or one gguf-py quantizes ("Q8_0",
        "Q4_0", ...). 1-D tensors (norms, biases) stay F32, as llama.cpp keeps them.
    name: ``general.name`` (default: "tiny-<model_type>"; llama.cpp writes Mistral models as
        architecture "llama" and only the name tells them apart).
    architecture: override ``general.architecture`` (to write deliberately wrong files).
    tensors: llama.cpp name -> (raw array, GGMLQuantizationType) written as is, replacing the
        converted tensor of that name or adding one.
    extra_metadata: key -> str/int/float/bool added to the metadata.
    """
    import gguf

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    model_type = cfg["model_type"]
    arch = architecture or ("llama" if model_type == "mistral" else model_type)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or {}
    state = read_hf_state_dict(model_dir)
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name or f"tiny-{model_type}")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    _add_tokenizer_metadata(w, Path(model_dir), cfg["vocab_size"])
    for key, value in (extra_metadata or {}).items():
        {str: w.add_string, int: w.add_uint32, float: w.add_float32,
         bool: w.add_bool}[type(value)](key, value)

    qt = gguf.GGMLQuantizationType[qtype]
    replaced = dict(tensors or {})
    for hf_name, t in state.items():
        gname = gguf_name(hf_name)
        if gname in replaced:
            data, raw_type = replaced.pop(gname)
            w.add_tensor(gname, data, raw_dtype=raw_type)
            continue
        x = t.to(torch.float32).numpy()
        if arch == "llama" and ".attn_q." in gname:
            x = llama_cpp_permute(x, heads, heads)
        elif arch == "llama" and ".attn_k." in gname:
            x = llama_cpp_permute(x, heads, kv_heads)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim == 1 or qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor(gname, x)
        elif qt == gguf.GGMLQuantizationType.F16:
            w.add_tensor(gname, x.astype(np.float16))
        else:
            w.add_tensor(gname, gguf.quants.quantize(x, qt), raw_dtype=qt)
    for gname, (data, raw_type) in replaced.items():
        w.add_tensor(gname, data, raw_dtype=raw_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _add_tokenizer_metadata(w: Any, model_dir: Path, vocab_size: int) -> None:
    """llama.cpp's "gpt2" (byte-level BPE) tokenizer metadata from ``tokenizer.json``; the
    token list is padded with ``[PAD<i>]`` to the model's vocabulary, as llama.cpp does."""
    import gguf

    tok = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    specials = {a["content"] for a in tok.get("added_tokens", []) if a.get("special")}
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, i in vocab.items():
        if i < vocab_size:
            tokens[i] = text
            types[i] = gguf.TokenType.CONTROL if text in specials else gguf.TokenType.NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(merges)
    w.add_bos_token_id(EOS_TOKEN_ID)
    w.add_eos_token_id(EOS_TOKEN_ID)
    w.add_add_bos_token(False)
