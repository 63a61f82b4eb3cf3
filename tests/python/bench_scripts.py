"""Loads the repository's benchmark scripts (bench/*.py, bench/gpu/*.py) as modules for the
tests that run them end to end."""

import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_script(relative: str):
    """The script at ``REPO / relative`` as a module; its directory is on sys.path while it
    loads (scripts import their neighbours). It is registered in sys.modules under its stem
    before it runs, as an import would (dataclasses look their module up there)."""
    path = REPO / relative
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))


def mean_accepted(text: str) -> float:
    """The "mean accepted N" a verification benchmark prints."""
    return float(re.search(r"mean accepted ([0-9.]+)", text).group(1))
