"""Puts the default model pair into specd's cache on a machine that cannot reach the package
index (the lent GPU machine), from byte-split parts of the two GGUF files carried there.

Here (a machine with the pair cached by a first `specd bench`):
    mkdir -p .models && cat $CACHE/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        $CACHE/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf | split -b 60M -d -a 2 - .models/part
then each part travels (one device call each: the call carries 64 MiB at most) and is moved
out of the checkout, e.g. to /tmp/parts. There:
    python bench/gpu/install_pair_parts.py /tmp/parts

The parts are read in name order as one stream: the target's bytes, then the draft's (sizes
from specd.hub). Each file is checked against the sha256 that specd.hub pins and refused if it
differs; on success it lies in $SPECD_CACHE with its stamp, exactly as `specd.hub.materialize`
leaves it, so `specd bench` and `specd bench load` use it without downloading.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from specd.hub import DRAFT, TARGET, cache_dir

CHUNK = 1 << 22


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", type=Path, help="folder of the parts (their name order is the byte order)")
    args = parser.parse_args()
    parts = sorted(p for p in args.parts.iterdir() if p.is_file())
    total = sum(p.stat().st_size for p in parts)
    if total != TARGET.size + DRAFT.size:
        print(f"error: the {len(parts)} parts hold {total} bytes; the pair is {TARGET.size + DRAFT.size}",
              file=sys.stderr)
        return 1
    stream = (open(p, "rb") for p in parts)
    current = next(stream)
    for source in (TARGET, DRAFT):
        final = cache_dir() / source.filename
        partial = final.with_name(final.name + ".partial")
        digest, left = hashlib.sha256(), source.size
        with open(partial, "wb") as out:
            while left:
                chunk = current.read(min(CHUNK, left))
                if not chunk:
                    current.close()
                    current = next(stream)
                    continue
                out.write(chunk)
                digest.update(chunk)
                left -= len(chunk)
        if digest.hexdigest() != source.sha256:
            partial.unlink()
            print(f"error: {source.name}: sha256 {digest.hexdigest()} differs from the pinned {source.sha256}",
                  file=sys.stderr)
            return 1
        os.replace(partial, final)
        final.with_suffix(final.suffix + ".sha256").write_text(source.sha256 + "\n")
        print(f"{final}: {source.size} bytes, sha256 verified")
    current.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
