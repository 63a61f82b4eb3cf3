"""Reading a Hugging Face model directory: ``config.json`` and safetensors weights.

Weights come from ``model.safetensors`` or, for sharded checkpoints, from the files named in
``model.safetensors.index.json``. Every tensor the config implies is checked for presence and
shape before any is read; tensors are then read one at a time and cast to the requested dtype.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from specd.errors import ModelLoadError, UnsupportedModelError
from specd.models.config import ModelConfig

__all__ = ["read_hf_config", "load_hf_weights"]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors older checkpoints carry that the model does not need.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def _listdir(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError as e:
        raise ModelLoadError(f"{directory}: cannot list the directory: {e}") from e


def read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: cannot read JSON: {e}") from e


def read_hf_config(model_dir: str) -> ModelConfig:
    """The :class:`ModelConfig` of ``config.json`` (plus ``generation_config.json``'s eos ids)."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        hint = ""
        ggufs = [f for f in _listdir(model_dir) if f.endswith(".gguf")]
        if ggufs:
            hint = f"; to load a GGUF file, pass its path (e.g. {os.path.join(model_dir, ggufs[0])})"
        raise ModelLoadError(f"{model_dir} has no config.json: expected a Hugging Face model "
                             f"directory (config.json + *.safetensors){hint}")
    d = read_json(path)
    gen_path = os.path.join(model_dir, "generation_config.json")
    gen = read_json(gen_path) if os.path.isfile(gen_path) else None
    try:
        return ModelConfig.from_hf_dict(d, gen if isinstance(gen, dict) else None)
    except ModelLoadError as e:  # say which file
        raise type(e)(f"{path}: {e}") from e


def _weight_files(model_dir: str) -> dict[str, list[str]]:
    """Weight file path -> the tensor names the index places in it (empty when unsharded)."""
    index_path = os.path.join(model_dir, INDEX_FILE)
    if os.path.isfile(index_path):
        index = read_json(index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index_path}: no 'weight_map' object")
        files: dict[str, list[str]] = {}
        for name, fname in weight_map.items():
            files.setdefault(os.path.join(model_dir, str(fname)), []).append(name)
        for path in files:
            if not os.path.isfile(path):
                raise ModelLoadError(f"{path}: weight file named in {INDEX_FILE} does not exist")
        return files
    single = os.path.join(model_dir, SINGLE_FILE)
    if os.path.isfile(single):
        return {single: []}
    present = [f for f in _listdir(model_dir)
               if f.endswith((".safetensors", ".bin", ".pt", ".pth", ".gguf"))]
    found = f"; found {', '.join(present)}" if present else ""
    raise ModelLoadError(f"{model_dir}: no weights: expected {SINGLE_FILE} or {INDEX_FILE} "
                         f"(only safetensors checkpoints are supported){found}")


def _open(path: str) -> Any:
    from safetensors import safe_open

    try:
        return safe_open(path, framework="pt", device="cpu")
    except Exception as e:  # SafetensorError: header too short, sizes past the end, bad JSON
        raise ModelLoadError(f"{path}: not a readable safetensors file (truncated or "
                             f"corrupt?): {e}") from e


def load_hf_weights(model_dir: str, config: ModelConfig, dtype: torch.dtype, *,
                    progress: bool = False) -> dict[str, torch.Tensor]:
    """All weights of the checkpoint in ``model_dir`` as CPU tensors of ``dtype``."""
    expected = config.weight_shapes()
    files = _weight_files(model_dir)
    handles = {path: _open(path) for path in files}
    location: dict[str, str] = {}
    unexpected: list[str] = []
    for path, f in handles.items():
        listed = set(files[path])
        names = set(f.keys())
        absent = sorted(listed - names)
        if absent:
            raise ModelLoadError(f"{path}: tensor {absent[0]} is listed in {INDEX_FILE} but "
                                 f"not in the file")
        for name in names:
            if name.endswith(_IGNORED_SUFFIXES) or (name == "lm_head.weight"
                                                    and config.tie_word_embeddings):
                continue  # a tied checkpoint may also save lm_head; transformers ignores it
            if name not in expected:
                unexpected.append(name)
                continue
            location[name] = path
            sl = f.get_slice(name)
            shape, st_dtype = tuple(sl.get_shape()), sl.get_dtype()
            if shape != expected[name]:
                raise ModelLoadError(f"{path}: tensor {name} has shape {shape}, expected "
                                     f"{expected[name]} from config.json")
            if st_dtype not in _FLOAT_DTYPES:
                raise UnsupportedModelError(f"{path}: tensor {name} has dtype {st_dtype}; only "
                                            f"float weights ({', '.join(_FLOAT_DTYPES)}) are "
                                            "supported")
    if unexpected:
        raise ModelLoadError(f"{model_dir}: tensors the config does not describe: "
                             f"{', '.join(sorted(unexpected)[:5])}"
                             f"{' ...' if len(unexpected) > 5 else ''}")
    missing = [name for name in expected if name not in location]
    if missing:
        where = ", ".join(os.path.basename(p) for p in files)
        raise ModelLoadError(f"{model_dir}: tensor {missing[0]} is missing from {where}"
                             f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}")

    weights: dict[str, torch.Tensor] = {}
    items = list(expected)
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc=f"loading {os.path.basename(model_dir)}", unit="tensor")
    for name in items:
        path = location[name]
        try:
            t = handles[path].get_tensor(name)
        except Exception as e:
            raise ModelLoadError(f"{path}: cannot read tensor {name}: {e}") from e
        weights[name] = t.to(dtype).contiguous()
    return weights

