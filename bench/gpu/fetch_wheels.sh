#!/usr/bin/env bash
# Downloads, here (where pip reaches PyPI), the wheels of the optional test dependencies the
# lent GPU machine lacks (it has torch and transformers but no network): xgrammar (structured
# outputs' GPU masking test) and FastAPI/uvicorn/httpx (the server's GPU test), for that
# machine's Python (3.12 in every session so far), into .gpu-wheels/ (about 8 MB). Carry the
# folder to the device call (carry=[".gtest-src", ".gpu-wheels"]); run.sh installs what it
# finds there into a private folder on PYTHONPATH before the tests.
#
# Usage: bash bench/gpu/fetch_wheels.sh [PYTHON_VERSION]   (default 3.12)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="$ROOT/.gpu-wheels"
PY="${1:-3.12}"
rm -rf "$DEST" && mkdir -p "$DEST"
# --no-deps: the machine's torch, numpy and transformers stay; these are what is missing there.
python -m pip download --disable-pip-version-check --no-deps --only-binary=:all: --python-version "$PY" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_28_x86_64 -d "$DEST" \
  xgrammar apache-tvm-ffi fastapi starlette pydantic pydantic-core annotated-types typing-inspection \
  anyio uvicorn h11 click httpx httpcore idna certifi annotated-doc typing-extensions
grep -qs '^/.gpu-wheels/$' "$ROOT/.git/info/exclude" || echo /.gpu-wheels/ >> "$ROOT/.git/info/exclude"
du -sh "$DEST"
