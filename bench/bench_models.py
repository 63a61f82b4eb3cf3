"""The models of the Python benchmarks: a synthetic random Llama (and a draft cut from it) or
given ones; one set of command-line options for them.

Options (add_model_args): --target PATH|default (default: the real pair of specd.hub,
specd bench's), --draft PATH, --hidden / --layers (the synthetic target's size), --device,
--dtype. Without --target the models are SYNTHETIC: a random Llama of --layers layers and
--hidden width (8 x 512 by default: about 32M parameters) on a 8,192-token vocabulary, and a
1-layer draft cut from it (tests/python/test_engine.self_draft), built in a directory the
caller owns.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Optional


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None,
                   help="a model directory or GGUF, or 'default' (the real pair; default: a synthetic Llama)")
    p.add_argument("--draft", default=None)
    p.add_argument("--hidden", type=int, default=512, help="synthetic target: hidden size (default 512)")
    p.add_argument("--layers", type=int, default=8, help="synthetic target: layers (default 8)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")


def synthetic_models(root: Path, with_draft: bool, hidden: int = 512, layers: int = 8) -> tuple[Path, Optional[Path]]:
    """A random Llama under ``root`` and, ``with_draft``, a 1-layer draft cut from it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
    from test_engine import self_draft
    from tiny_models import make_tiny_model, make_tokenizer

    tok = root / "tokenizer"
    make_tokenizer(tok)
    make_tiny_model(root / "target", "llama", vocab_size=8192, hidden_size=hidden, layers=layers, heads=8,
                    kv_heads=2, intermediate=3 * hidden, tokenizer_dir=tok, seed=1, lm_head_scale=10.0,
                    max_position_embeddings=8192)
    return root / "target", (self_draft(root / "target", root / "draft") if with_draft else None)


def resolve_models(args, root: Path, with_draft: bool) -> tuple[Path, Optional[Path], bool]:
    """(target, draft, synthetic) from add_model_args' options; synthetic models go under ``root``."""
    if args.target is None:
        return (*synthetic_models(root, with_draft, args.hidden, args.layers), True)
    if args.target == "default":
        from specd import hub

        target, draft = hub.default_pair(args.dtype, with_draft=with_draft)
        return target, draft, False
    return args.target, args.draft, False


def models_for(args, script: str):
    """(a temporary directory to clean up, target, draft, synthetic, methods) for a script with
    a comma-separated ``--methods`` option that may name "draft"; None, after saying why on
    stderr, when "draft" has no draft model."""
    methods = [m for m in args.methods.split(",") if m]
    tmp = tempfile.TemporaryDirectory()
    target, draft, synthetic = resolve_models(args, Path(tmp.name), "draft" in methods)
    if "draft" in methods and draft is None:
        print(f"{script}: method draft needs --draft", file=sys.stderr)
        tmp.cleanup()
        return None
    return tmp, target, draft, synthetic, methods
