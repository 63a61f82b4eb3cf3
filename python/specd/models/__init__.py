"""Models: configuration, loading (Hugging Face safetensors directories and GGUF files).

:func:`load_model` reads a model into a :class:`LoadedModel` (a :class:`ModelConfig`, weights in
Hugging Face Llama naming, the tokenizer); :func:`check_compatible` checks a target/draft pair.
"""

from __future__ import annotations

from specd.models.config import ModelConfig
from specd.models.kernel_choice import KernelChoice
from specd.models.loader import LoadedModel, check_compatible, load_model

__all__ = [
    "ModelConfig",
    "KernelChoice",
    "LoadedModel",
    "load_model",
    "check_compatible",
]
