"""load_model: a Hugging Face safetensors directory or a GGUF file -> config, weights, tokenizer.

Whatever the source, the result is the same :class:`LoadedModel`: a validated
:class:`ModelConfig`, every weight in Hugging Face ``LlamaForCausalLM`` naming (``[out, in]``
layout, see :meth:`ModelConfig.weight_shapes`) as a CPU tensor of one dtype, and the model's
tokenizer. A bad path or file raises :class:`ModelLoadError` (or its subclass
:class:`UnsupportedModelError`) naming the file or tensor and what was expected.
:func:`check_compatible` says whether a draft model can propose tokens for a target.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from specd.errors import IncompatibleModelsError, InvalidArgumentError, ModelLoadError
from specd.models.config import ModelConfig

__all__ = ["LoadedModel", "load_model", "check_compatible", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_GGUF_MAGIC = b"GGUF"


@dataclass
class LoadedModel:
    """A model read from disk.

    config: its shape and hyper-parameters.
    weights: Hugging Face name -> CPU tensor of one dtype; ``lm_head.weight`` is absent when
        ``config.tie_word_embeddings`` (use ``model.embed_tokens.weight``).
    tokenizer: a transformers ``PreTrainedTokenizerBase``, or None when not requested.
    source: the path it was read from. format: "hf" or "gguf".
    """

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Optional[Any]
    source: str
    format: str

    @property
    def dtype(self) -> torch.dtype:
        return self.weights["model.embed_tokens.weight"].dtype

    def lm_head_weight(self) -> torch.Tensor:
        """``lm_head.weight``, or the embedding when the two are tied. ``[vocab, hidden]``"""
        return self.weights.get("lm_head.weight", self.weights["model.embed_tokens.weight"])


def _check_dtype(dtype: Union[torch.dtype, str]) -> torch.dtype:
    if isinstance(dtype, str) and dtype in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype]
    if isinstance(dtype, torch.dtype) and dtype in SUPPORTED_DTYPES:
        return dtype
    raise InvalidArgumentError(f"dtype must be one of torch.float32, torch.bfloat16, "
                               f"torch.float16; got {dtype!r}")


def _is_gguf_file(path: str) -> bool:
    if path.lower().endswith(".gguf"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == _GGUF_MAGIC
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read: {e}") from e


def load_model(path: Union[str, "os.PathLike[str]"], dtype: Union[torch.dtype, str] = torch.float32,
               *, tokenizer: bool = True, progress: bool = False) -> LoadedModel:
    """Load a model for specd.

    path: a Hugging Face directory (``config.json`` + ``model.safetensors`` or a sharded
        checkpoint with ``model.safetensors.index.json``) or a ``.gguf`` file (one file, any
        of the float, legacy or K-quant types; weights are dequantized).
    dtype: torch.float32, torch.bfloat16 or torch.float16 (or their names).
    tokenizer: also build the tokenizer with transformers (from the GGUF metadata for GGUF).
    progress: show a progress bar over tensors.
    """
    dtype = _check_dtype(dtype)
    source = os.fspath(path)
    if not os.path.exists(source):
        raise ModelLoadError(f"model path {source} does not exist")
    if os.path.isdir(source):
        return _load_hf(source, dtype, tokenizer, progress)
    if _is_gguf_file(source):
        return _load_gguf(source, dtype, tokenizer, progress)
    raise ModelLoadError(f"{source} is neither a directory (config.json + *.safetensors) nor a "
                         ".gguf file")


def _load_hf(model_dir: str, dtype: torch.dtype, want_tokenizer: bool,
             progress: bool) -> LoadedModel:
    from specd.models.hf_loader import load_hf_weights, read_hf_config
    from specd.models.tokenizer_loader import load_hf_tokenizer

    config = read_hf_config(model_dir)
    weights = load_hf_weights(model_dir, config, dtype, progress=progress)
    tok = load_hf_tokenizer(model_dir) if want_tokenizer else None
    return LoadedModel(config, weights, tok, model_dir, "hf")


def _load_gguf(path: str, dtype: torch.dtype, want_tokenizer: bool,
               progress: bool) -> LoadedModel:
    from specd.models.gguf_loader import load_gguf_weights, open_gguf
    from specd.models.tokenizer_loader import load_gguf_tokenizer

    reader = open_gguf(path)
    try:
        config = ModelConfig.from_gguf(reader)
    except ModelLoadError as e:  # say which file
        raise type(e)(f"{path}: {e}") from e
    weights = load_gguf_weights(reader, config, dtype, source=path, progress=progress)
    del reader  # release the memory map before the tokenizer maps the file again
    tok = load_gguf_tokenizer(path) if want_tokenizer else None
    return LoadedModel(config, weights, tok, path, "gguf")


def check_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise :class:`IncompatibleModelsError` unless ``draft`` can propose tokens for
    ``target``: equal vocabulary sizes and, when both have tokenizers, the same ids for a few
    probe texts (code, prose, non-ASCII)."""
    from specd.models.tokenizer_loader import check_same_tokenization

    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise IncompatibleModelsError(f"target vocabulary has {tv} entries, draft {dv}: a draft "
                                      "must share the target's vocabulary")
    if target.tokenizer is not None and draft.tokenizer is not None:
        check_same_tokenization(target.tokenizer, draft.tokenizer)
