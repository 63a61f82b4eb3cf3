"""Tokenizers for loaded models (transformers), and the target/draft tokenizer check.

A Hugging Face directory's tokenizer comes from ``AutoTokenizer.from_pretrained(dir)``. A GGUF
file's comes from its metadata: ``AutoTokenizer.from_pretrained(dir, gguf_file=name)``, which
rebuilds the tokenizer llama.cpp describes (byte-level BPE "gpt2" or sentencepiece "llama").
transformers prefers a ``tokenizer.json`` lying beside the GGUF file over the file's own
metadata (and then loses its special tokens), so the GGUF file is shown to transformers alone,
through a symbolic link in a temporary directory. Nothing is ever downloaded
(``local_files_only``). When transformers cannot build a tokenizer, the error says why; there
is no fallback to some other tokenizer.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Sequence

from specd.errors import IncompatibleModelsError, ModelLoadError

__all__ = ["load_hf_tokenizer", "load_gguf_tokenizer", "check_same_tokenization",
           "PROBE_TEXTS"]

# Code, prose and non-ASCII text: two tokenizers that split these alike are taken as equal.
PROBE_TEXTS = (
    "def fibonacci(n: int) -> int:\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. It's 3.14159 o'clock, isn't it?",
    "naïve café — Ωμέγα, 東京タワー, emoji 🚀✨, tabs\tand  spaces\n\n",
)


def _auto_tokenizer() -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ModelLoadError("loading a tokenizer needs the 'transformers' package; pass "
                             "tokenizer=False to load weights only") from e
    return AutoTokenizer


def load_hf_tokenizer(model_dir: str) -> Any:
    """``AutoTokenizer.from_pretrained(model_dir)``, offline."""
    auto = _auto_tokenizer()
    try:
        return auto.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:
        raise ModelLoadError(f"{model_dir}: transformers could not build the tokenizer "
                             f"({type(e).__name__}: {e}); pass tokenizer=False to load the "
                             "weights without one") from e


def load_gguf_tokenizer(gguf_path: str) -> Any:
    """The tokenizer stated by a GGUF file's ``tokenizer.ggml.*`` metadata, via transformers."""
    auto = _auto_tokenizer()
    gguf_path = os.path.abspath(gguf_path)
    name = os.path.basename(gguf_path)
    try:
        with tempfile.TemporaryDirectory(prefix="specd-gguf-tok-") as alone:
            try:
                os.symlink(gguf_path, os.path.join(alone, name))
                where = alone
            except OSError:  # no symlinks here: load in place
                where = os.path.dirname(gguf_path)
            tokenizer = auto.from_pretrained(where, gguf_file=name, local_files_only=True)
    except Exception as e:
        raise ModelLoadError(f"{gguf_path}: transformers could not build the tokenizer from "
                             f"the GGUF metadata ({type(e).__name__}: {e}); pass "
                             "tokenizer=False to load the weights without one") from e
    return tokenizer


def check_same_tokenization(target: Any, draft: Any,
                            probes: Sequence[str] = PROBE_TEXTS) -> None:
    """Raise IncompatibleModelsError if the two tokenizers encode any probe differently."""
    for text in probes:
        a = list(target.encode(text, add_special_tokens=False))
        b = list(draft.encode(text, add_special_tokens=False))
        if a != b:
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            raise IncompatibleModelsError(
                f"target and draft tokenizers disagree on {text[:40]!r}...: target gives "
                f"{len(a)} ids, draft {len(b)}; first difference at index {first}: "
                f"target {a[first:first + 5]} vs draft {b[first:first + 5]}")
