#!/usr/bin/env bash
# The whole specd test suite: C++ unit tests (ctest), the same under AddressSanitizer +
# UndefinedBehaviorSanitizer, then the Python package built and installed with pip and its
# tests (pytest). Exits non-zero on the first failure.
#
# Needs: a C++17 compiler, CMake >= 3.24, GoogleTest (Debian: libgtest-dev), Python >= 3.9
# with pip. nvcc is optional: when found, the CUDA kernels are compiled too (SPECD_CUDA=AUTO);
# their GPU tests skip, saying why, on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${SPECD_TEST_JOBS:-$(nproc)}"
section() { printf '\n==== %s ====\n' "$*"; }

section "C++ unit tests (RelWithDebInfo, CUDA=${SPECD_CUDA:-AUTO})"
cmake -S . -B build/tests -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPECD_BUILD_TESTS=ON \
      -DSPECD_BUILD_BENCH=ON -DSPECD_CUDA="${SPECD_CUDA:-AUTO}"
cmake --build build/tests -j "$jobs"
ctest --test-dir build/tests --output-on-failure -j "$jobs"

section "C++ unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DSPECD_BUILD_TESTS=ON \
      -DSPECD_SANITIZE=ON -DSPECD_CUDA=OFF
cmake --build build/asan -j "$jobs"
# The statistical verification tests run 100,000 trials per case in the build above; under
# the sanitizers (10x slower) 20,000 trials per case still exercise every code path.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
SPECD_STAT_TRIALS=20000 ctest --test-dir build/asan --output-on-failure -j "$jobs"

section "Python package (pip install .[test]) and pytest"
python -m pip install --disable-pip-version-check ".[test]"
python -m pytest tests/python
