"""Options and model resolution shared by the specd subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", type=Path, help="target model: a Hugging Face directory or a .gguf file "
                   "(default: Qwen2.5-Coder-1.5B-Instruct, fetched and cached on first use)")
    p.add_argument("--draft", type=Path, help="draft model (default with the default target: "
                   "Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32", "float16"],
                   help="weights and KV dtype; auto (default): bfloat16 on CUDA or CPUs with native bf16 "
                        "matmul (AVX-512-BF16/AMX), float32 elsewhere")
    p.add_argument("--device", default="auto", metavar="{auto,cpu,cuda,cuda:N}",
                   help="where the models and the KV cache live; auto (default): cuda when torch sees a GPU, "
                        "else cpu")


def resolve_models(args, want_draft: bool) -> tuple[Path, Optional[Path]]:
    """(target, draft) paths; the default pair is materialized when --target is absent.
    Also resolves ``args.device`` and ``args.dtype == "auto"`` for this machine (an
    unavailable device raises InvalidArgumentError, which the CLI prints as an error)."""
    from specd.hardware import resolve_device, resolve_dtype

    args.device = resolve_device(args.device)
    args.dtype = resolve_dtype(args.dtype, args.device)
    if args.target is not None:
        return args.target, args.draft if want_draft else None
    from specd.hub import default_pair

    print("specd: using the default pair (Qwen2.5-Coder-1.5B / 0.5B Instruct, cached after the first run)",
          file=sys.stderr)
    return default_pair(args.dtype, with_draft=want_draft)


def positive_floats(text: str) -> list[float]:
    """An argparse type: comma-separated positive numbers ("inf" included)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError("rates must be positive numbers")
    return values
