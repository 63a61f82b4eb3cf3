"""The installed package: version, build facts, CUDA detection, error hierarchy."""

import re
from importlib.metadata import version
from pathlib import Path

import specd
from specd import errors


def test_version_matches_distribution_and_cmake():
    assert specd.__version__ == version("specd")
    cmake = (Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    assert re.search(r"project\(specd VERSION ([0-9.]+)", cmake).group(1) == specd.__version__


def test_cuda_queries_are_consistent():
    assert isinstance(specd.built_with_cuda(), bool)
    assert isinstance(specd.cuda_available(), bool)
    if not specd.built_with_cuda():
        assert not specd.cuda_available()
    if specd.cuda_available():
        import torch

        assert torch.cuda.is_available()


def test_error_classes_derive_from_builtins():
    assert issubclass(errors.InvalidArgumentError, ValueError)
    assert issubclass(errors.UnknownSequenceError, KeyError)
    assert issubclass(errors.OutOfRangeError, IndexError)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.SpecdError)
        assert getattr(specd, name) is getattr(errors, name)
