#!/usr/bin/env bash
# GPU validation and timing of specd's CUDA path, sized for one 10-minute call on the lent GPU
# machine (device tool: `run`, command `bash bench/gpu/run.sh`). Stages, each under its own
# time limit so the whole fits in ~9 minutes:
#   1 build  (~4 min)  cmake with SPECD_CUDA=ON, SPECD_BUILD_PYTHON=ON and, when GoogleTest is
#                      found (installed, or sources in $SPECD_GTEST_SRC / .gtest-src /
#                      /usr/src/googletest, built first), SPECD_BUILD_TESTS=ON; native GPU arch.
#                      Not `pip install .`: that machine has no network, and its torch is not
#                      the version pyproject pins. The Python package runs from a private copy
#                      of python/specd with the built _core (nothing is installed).
#   2 ctest  (~2-3 min) ctest -R Cuda (the GPU-vs-CPU C++ tests of every kernel)
#   3 pytest (~2-4 min, -v so a timed-out run still shows each result) the Python GPU tests: ops on cuda vs cpu (layer ops included), draft graph replay vs eager
#                      and without host sync, slot mapping / KV kernels on cuda, the statistical
#                      losslessness tests on the GPU path (test_gpu_statistics.py), graphs captured up
#                      front and the CLI on cuda (test_serving_setup.py), the engine's batched
#                      sampled verification on cuda vs the CPU path (test_batch_verify.py), the
#                      draft tree runner's graphs vs its eager code (test_draft_tree_graph.py),
#                      the draft forward compiled by inductor (test_compile.py), 16-bit logits
#                      (test_logits_dtype.py), logprobs and logits processors through the graph runners,
#                      the HTTP server replaying CUDA graphs from its engine thread (test_serve.py; needs fastapi),
#                      prefix caching with the graph runners (test_prefix_caching.py), tree-path compaction
#                      (test_kv_pool_compact.py), one-copy uploads (test_uploads.py), the package's CUDA
#                      queries (test_package.py), structured outputs' GPU masking (test_structured_outputs.py; needs xgrammar)
#   4 bench  (~3 min)  bench_kernels.py (kernels vs the torch/host paths: device and host time
#                      per call, bandwidth bounds), batch_invariance.py (whether the target's products
#                      and the attention kernels round a row alike at every batch size and query count) and bench_draft_loop.py (draft loop: eager vs
#                      graph runner vs CUDA graph, host overhead per draft step; its --budget-s is
#                      what is left of the run's TOTAL_S, at most 180 s, rows printed as measured)
#   5 tree   (opt-in: --stages "... tree") bench/kv_compact_step.py --device cuda (a step's
#                      tree-path KV moves: per request with copy_slots vs one kv_compact per
#                      model), then bench_draft_loop.py --quick --tree-width 4: draft-model
#                      trees grown by the host loop vs the tree runner (draft_tree_graph.py),
#                      eager and captured; JSON in $OUT/tree/
#   5b sampled (opt-in: --stages "... sampled") bench/logits_processors_cost.py --device cuda
#                      (penalised rows, every column vs the changeable ones), bench/verify_totals.py --device cuda (stochastic
#                      verification with / without the rows' totals, all and half the chains
#                      accepted), bench/verify_logits.py --device cuda (the step's sampled
#                      verification from bfloat16 logits vs sampling_probs + verify_stochastic,
#                      all chains accepted; half with top-p 0.9), then
#                      bench_draft_loop.py --quick --temperature 0.8: the draft
#                      loop and engine steps with seeded sampled requests; JSON in $OUT/sampled/
#   6 timeline (opt-in: --stages "... timeline") bench/gpu/step_timeline.py: engine steps under
#                      torch.profiler, the GPU's idle time per step attributed to the host phase
#                      running then, drafts read on the host vs kept on the device; into bench.log
#   7 profile (opt-in: --stages "... profile") Nsight Compute (ncu, --clock-control none) on one
#                      call of each sampling case of bench/gpu/profile_sampling.py (speed of
#                      light, occupancy, warp states, pipes, memory): what bounds the sampling
#                      passes; report in $OUT/profile.log, then the same cases timed without the
#                      profiler (profile_sampling.py --time --graph: device µs per call, CUDA-graph replays),
#                      and bench/root_sampling.py --device cuda (draft-less sampled steps: verify
#                      the root vs sample_tokens, inverse-CDF and Gumbel-max draws)
# $OUT (else bench-results/gpu) gets 7 files: build.log, ctest.log, pytest.log, bench.log,
# bench_kernels.json, bench_draft_loop.json, summary.txt (8 with the tree or the profile stage,
# 9 with both: then leave out bench, as $OUT returns at most 8 files; the timeline stage writes
# into bench.log only); a short table is printed last.
#
# Usage: bash bench/gpu/run.sh [--dry-run] [--quick] [--skip-build] [--stages "build ctest pytest bench tree sampled timeline profile"]
#   --dry-run  print the plan and check the Python side imports (works without a GPU; the
#              package from $PYTHONPATH when set, else python/ with an in-tree _core)
#   --quick    fewer sizes / repetitions in the benchmarks
# Without a GPU, the benchmark scripts' logic can be checked with their --smoke-cpu option (tiny
# float32 cases on the CPU references; times nothing).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_DIR="${OUT:-$ROOT/bench-results/gpu}"
BUILD="$ROOT/build/gpu"
PKG="/tmp/specd_gpu_pkg"
STAGES="build ctest pytest bench"
TOTAL_S="${SPECD_GPU_TOTAL_S:-520}"  # the whole run must end within the 10-minute device call
DRY_RUN=0
QUICK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --quick) QUICK="--quick" ;;
    --skip-build) STAGES="${STAGES/build/}" ;;
    --stages) shift; STAGES="$1" ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
JOBS="$(nproc 2>/dev/null || echo 4)"
SUMMARY="$OUT_DIR/summary.txt"

gtest_source() {
  for d in "${SPECD_GTEST_SRC:-}" "$ROOT/.gtest-src" /usr/src/googletest; do
    if [ -n "$d" ] && [ -f "$d/CMakeLists.txt" ]; then echo "$d"; return; fi
  done
}

ncu_path() {  # Nsight Compute's command line, on PATH or where CUDA and Nsight install it
  command -v ncu && return
  for f in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
    if [ -x "$f" ]; then echo "$f"; return; fi
  done
  return 1
}

echo "specd GPU run: stages [$STAGES] quick=${QUICK:-no} python=$PYTHON jobs=$JOBS out=$OUT_DIR"
if [ "$DRY_RUN" = 1 ]; then
  echo "plan:"
  echo "  build : cmake -S $ROOT -B $BUILD -DSPECD_CUDA=ON -DSPECD_BUILD_PYTHON=ON -DSPECD_BUILD_TESTS=<if GoogleTest>" \
       "-DCMAKE_CUDA_ARCHITECTURES=native; GoogleTest sources: $(gtest_source || true)"
  echo "  ctest : ctest --test-dir $BUILD -R Cuda -j 4"
  echo "  pytest: pytest tests/python/{test_ops,test_draft_graph,test_kv_kernels,test_slot_mapping,test_gpu_statistics,test_target_graph,test_layer_ops,test_serving_setup,test_batch_verify,test_draft_tree_graph,test_timer,test_compile,test_logits_dtype,test_logprobs,test_logits_processors,test_serve,test_prefix_caching,test_kv_pool_compact,test_package,test_uploads,test_structured_outputs}.py -k 'gpu or cuda'"
  echo "  timeline (opt-in): bench/gpu/step_timeline.py (engine steps under torch.profiler)"
  echo "  bench : bench/gpu/bench_kernels.py $QUICK; bench/gpu/batch_invariance.py;" \
       "bench/gpu/bench_draft_loop.py $QUICK --budget-s <min(180, ${TOTAL_S} s - elapsed - 30)>"
  echo "  wheels: $(ls "$ROOT"/.gpu-wheels/*.whl 2>/dev/null | wc -l) carried in .gpu-wheels (bench/gpu/fetch_wheels.sh)"
  command -v nvcc >/dev/null && echo "  nvcc  : $(nvcc --version | tail -1)" || echo "  nvcc  : not found"
  PYTHONPATH="${PYTHONPATH:-}" "$PYTHON" "$ROOT/bench/gpu/bench_kernels.py" --dry-run $QUICK --out "$OUT_DIR" || exit 1
  PYTHONPATH="${PYTHONPATH:-}" "$PYTHON" "$ROOT/bench/gpu/bench_draft_loop.py" --dry-run $QUICK --out "$OUT_DIR" || exit 1
  echo "  profile (opt-in): $(ncu_path || echo 'ncu not found here') on bench/gpu/profile_sampling.py, then its --time --graph:"
  PYTHONPATH="${PYTHONPATH:-}" "$PYTHON" "$ROOT/bench/gpu/profile_sampling.py" --dry-run | sed 's/^/    /' || exit 1
  exit 0
fi

mkdir -p "$OUT_DIR"
: > "$SUMMARY"
status=0
note() { echo "$*" | tee -a "$SUMMARY"; }
stage() {  # stage NAME LOG LIMIT_S COMMAND...: runs with a time limit, appends to $OUT/LOG.log
  local name="$1" log="$2" limit="$3"; shift 3
  local t0=$SECONDS
  timeout "$limit" "$@" >> "$OUT_DIR/$log.log" 2>&1
  local rc=$?
  note "[$name] rc=$rc ($((SECONDS - t0)) s)$([ $rc = 124 ] && echo ' TIMED OUT')"
  [ $rc = 0 ] || status=1
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$SUMMARY"

if [[ " $STAGES " == *" build "* ]]; then
  : > "$OUT_DIR/build.log"
  GTEST_ARGS=(-DSPECD_BUILD_TESTS=OFF)
  if [[ " $STAGES " == *" ctest "* ]]; then
    src="$(gtest_source || true)"
    if [ -n "$src" ]; then
      stage gtest build 120 bash -c "cmake -S '$src' -B /tmp/gtest-build -DCMAKE_INSTALL_PREFIX=/tmp/gtest \
        -DBUILD_GMOCK=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON && cmake --build /tmp/gtest-build -j$JOBS \
        && cmake --install /tmp/gtest-build" && GTEST_ARGS=(-DSPECD_BUILD_TESTS=ON -DCMAKE_PREFIX_PATH=/tmp/gtest)
    elif compgen -G "/usr/lib/*/libgtest*" > /dev/null || compgen -G "/usr/lib*/libgtest*" > /dev/null; then
      GTEST_ARGS=(-DSPECD_BUILD_TESTS=ON)
    else
      note "[gtest] not found (carry its sources as .gtest-src, see docs/cuda.md): C++ tests not built"
    fi
  fi
  # Ninja where there is one (also the Python environment's, e.g. torch's): it compiles the
  # bindings while the CUDA objects build, where make waits for the CUDA library first (the
  # seventh GPU session's build took 174 s with make). A build folder keeps its generator.
  export PATH="$(dirname "$PYTHON"):$PATH"
  GEN=()
  if [ -f "$BUILD/CMakeCache.txt" ]; then :
  elif command -v ninja > /dev/null; then GEN=(-G Ninja); fi
  note "[build] generator: ${GEN[*]:-$(grep -s CMAKE_GENERATOR:INTERNAL "$BUILD/CMakeCache.txt" | cut -d= -f2 || echo default)}"
  stage build build 300 bash -c "cmake -S '$ROOT' -B '$BUILD' ${GEN[*]} -DCMAKE_BUILD_TYPE=Release -DSPECD_CUDA=ON \
      -DSPECD_BUILD_PYTHON=ON -DCMAKE_CUDA_ARCHITECTURES=native -DPython_EXECUTABLE='$PYTHON' ${GTEST_ARGS[*]} \
    && cmake --build '$BUILD' -j$JOBS" || { tail -30 "$OUT_DIR/build.log"; }
fi

# The private package: python/specd with the freshly built _core.
rm -rf "$PKG" && mkdir -p "$PKG" && cp -r "$ROOT/python/specd" "$PKG/" && rm -f "$PKG"/specd/_core*.so
cp "$BUILD"/python/_core*.so "$PKG/specd/" 2>/dev/null || note "no built _core found in $BUILD/python"
export PYTHONPATH="$PKG:$ROOT/tests/python"
export PYTHONUNBUFFERED=1
# Optional test dependencies carried as wheels (bench/gpu/fetch_wheels.sh: xgrammar, FastAPI),
# installed into a private folder: the machine has no network.
if compgen -G "$ROOT/.gpu-wheels/*.whl" > /dev/null; then
  if "$PYTHON" -m pip install --disable-pip-version-check --no-index --no-deps --quiet --target /tmp/specd_gpu_wheels \
      "$ROOT"/.gpu-wheels/*.whl >> "$OUT_DIR/build.log" 2>&1; then
    export PYTHONPATH="$PYTHONPATH:/tmp/specd_gpu_wheels"
    note "[wheels] installed $(ls "$ROOT"/.gpu-wheels/*.whl | wc -l) carried wheels"
  else
    note "[wheels] the carried wheels did not install (build.log)"
  fi
fi

if [[ " $STAGES " == *" ctest "* ]]; then
  if [ -x "$BUILD/tests/specd_cuda_tests" ]; then
    : > "$OUT_DIR/ctest.log"
    # 4 at a time: the GPU runs small tests side by side (76 s one by one in the seventh session)
    stage ctest ctest 240 ctest --test-dir "$BUILD" -R Cuda -j 4 --output-on-failure --timeout 120
    grep -E "tests passed|tests failed|FAILED|Failed" "$OUT_DIR/ctest.log" | tail -15 | tee -a "$SUMMARY"
  else
    note "[ctest] skipped: specd_cuda_tests not built (GoogleTest not found)"
  fi
fi

if [[ " $STAGES " == *" pytest "* ]]; then
  : > "$OUT_DIR/pytest.log"
  stage pytest pytest 270 "$PYTHON" -m pytest -v -p no:cacheprovider -k "gpu or cuda" \
    "$ROOT/tests/python/test_ops.py" "$ROOT/tests/python/test_draft_graph.py" \
    "$ROOT/tests/python/test_kv_kernels.py" "$ROOT/tests/python/test_slot_mapping.py" \
    "$ROOT/tests/python/test_gpu_statistics.py" "$ROOT/tests/python/test_target_graph.py" \
    "$ROOT/tests/python/test_layer_ops.py" "$ROOT/tests/python/test_serving_setup.py" \
    "$ROOT/tests/python/test_batch_verify.py" "$ROOT/tests/python/test_draft_tree_graph.py" \
    "$ROOT/tests/python/test_timer.py" "$ROOT/tests/python/test_compile.py" \
    "$ROOT/tests/python/test_logits_dtype.py" "$ROOT/tests/python/test_logprobs.py" \
    "$ROOT/tests/python/test_logits_processors.py" "$ROOT/tests/python/test_serve.py" \
    "$ROOT/tests/python/test_prefix_caching.py" "$ROOT/tests/python/test_kv_pool_compact.py" \
    "$ROOT/tests/python/test_package.py" "$ROOT/tests/python/test_uploads.py" \
    $("$PYTHON" -c "import xgrammar" 2>/dev/null && echo "$ROOT/tests/python/test_structured_outputs.py")
  tail -15 "$OUT_DIR/pytest.log" | tee -a "$SUMMARY"
fi

if [[ " $STAGES " == *" bench "* ]]; then
  : > "$OUT_DIR/bench.log"
  stage bench_kernels bench 150 "$PYTHON" "$ROOT/bench/gpu/bench_kernels.py" $QUICK --out "$OUT_DIR"
  stage batch_invariance bench 60 "$PYTHON" "$ROOT/bench/gpu/batch_invariance.py"
  grep -A9 "^batch invariance" "$OUT_DIR/bench.log" | tail -10 | tee -a "$SUMMARY"
  budget=$(( TOTAL_S - SECONDS - 30 )); [ "$budget" -gt 180 ] && budget=180
  if [ "$budget" -ge 30 ]; then
    # the script stops starting cases at its budget; the limit leaves room for the case in flight
    stage bench_draft_loop bench $(( budget + 45 )) "$PYTHON" "$ROOT/bench/gpu/bench_draft_loop.py" $QUICK \
      --budget-s "$budget" --out "$OUT_DIR"
  else
    note "[bench_draft_loop] skipped: ${SECONDS} s used of the run's ${TOTAL_S} s"
  fi
  echo
  grep -v "^\[" "$OUT_DIR/bench.log" | tail -50
fi

if [[ " $STAGES " == *" tree "* ]]; then  # opt-in: draft-model trees, host loop vs the tree runner
  mkdir -p "$OUT_DIR/tree"
  stage kv_compact_step bench 60 "$PYTHON" "$ROOT/bench/kv_compact_step.py" --device cuda \
    --json "$OUT_DIR/tree/kv_compact_step.json"
  grep -A4 "^SYNTHETIC tree paths" "$OUT_DIR/bench.log" | tail -5 | tee -a "$SUMMARY"
  budget=$(( TOTAL_S - SECONDS - 30 )); [ "$budget" -gt 120 ] && budget=120
  if [ "$budget" -ge 30 ]; then
    stage bench_draft_tree bench $(( budget + 45 )) "$PYTHON" "$ROOT/bench/gpu/bench_draft_loop.py" --quick \
      --tree-width 4 --budget-s "$budget" --out "$OUT_DIR/tree"
  else
    note "[bench_draft_tree] skipped: ${SECONDS} s used of the run's ${TOTAL_S} s"
  fi
fi

if [[ " $STAGES " == *" sampled "* ]]; then  # opt-in: the draft loop with sampled requests
  stage logits_processors bench 60 "$PYTHON" "$ROOT/bench/logits_processors_cost.py" --device cuda
  grep -A4 "^SYNTHETIC penalised requests" "$OUT_DIR/bench.log" | tail -5 | tee -a "$SUMMARY"
  budget=$(( TOTAL_S - SECONDS - 30 )); [ "$budget" -gt 120 ] && budget=120
  if [ "$budget" -ge 30 ]; then
    stage verify_totals bench 60 "$PYTHON" "$ROOT/bench/verify_totals.py" --device cuda
    stage verify_totals_half bench 60 "$PYTHON" "$ROOT/bench/verify_totals.py" --device cuda --accept 0.5
    grep -A2 "^verify_stochastic, 64 chains" "$OUT_DIR/bench.log" | tail -6 | tee -a "$SUMMARY"
    stage verify_logits bench 90 "$PYTHON" "$ROOT/bench/verify_logits.py" --device cuda --dtype bfloat16
    stage verify_logits_half bench 90 "$PYTHON" "$ROOT/bench/verify_logits.py" --device cuda --dtype bfloat16 \
      --accept 0.5 --top-p 0.9
    grep -A2 "^sampled verification, 64 chains" "$OUT_DIR/bench.log" | tail -6 | tee -a "$SUMMARY"
    budget=$(( TOTAL_S - SECONDS - 30 )); [ "$budget" -gt 120 ] && budget=120
    stage bench_draft_sampled bench $(( budget + 45 )) "$PYTHON" "$ROOT/bench/gpu/bench_draft_loop.py" --quick \
      --temperature 0.8 --budget-s "$budget" --out "$OUT_DIR/sampled"
  else
    note "[bench_draft_sampled] skipped: ${SECONDS} s used of the run's ${TOTAL_S} s"
  fi
fi

if [[ " $STAGES " == *" timeline "* ]]; then  # opt-in: where engine steps leave the GPU idle
  if [ $(( TOTAL_S - SECONDS )) -ge 60 ]; then
    stage step_timeline bench 120 "$PYTHON" "$ROOT/bench/gpu/step_timeline.py"
    grep -E "^ +[0-9]+ (host read|on device)" "$OUT_DIR/bench.log" | tail -4 | tee -a "$SUMMARY"
  else
    note "[step_timeline] skipped: ${SECONDS} s used of the run's ${TOTAL_S} s"
  fi
fi

if [[ " $STAGES " == *" profile "* ]]; then  # opt-in: hardware counters of the sampling kernels
  ncu_bin="$(ncu_path || true)"
  if [ -z "$ncu_bin" ]; then
    note "[profile] skipped: ncu not found"
  elif [ $(( TOTAL_S - SECONDS )) -lt 60 ]; then
    note "[profile] skipped: ${SECONDS} s used of the run's ${TOTAL_S} s"
  else
    : > "$OUT_DIR/profile.log"
    stage profile profile $(( TOTAL_S - SECONDS - 20 > 240 ? 240 : TOTAL_S - SECONDS - 20 )) "$ncu_bin" \
      --clock-control none --nvtx --nvtx-include "profile/" --section SpeedOfLight --section Occupancy \
      --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis "$PYTHON" "$ROOT/bench/gpu/profile_sampling.py"
    grep -E "profile/|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per" \
      "$OUT_DIR/profile.log" | head -60 | tee -a "$SUMMARY"
    stage profile_time profile 60 "$PYTHON" "$ROOT/bench/gpu/profile_sampling.py" --time --graph
    grep -E "us per call" "$OUT_DIR/profile.log" | tee -a "$SUMMARY"
    stage root_sampling profile 90 "$PYTHON" "$ROOT/bench/root_sampling.py" --device cuda --reps 9
    grep -E "^(temperature|top-p)" "$OUT_DIR/profile.log" | tail -6 | tee -a "$SUMMARY"
  fi
fi

echo
echo "summary ($SUMMARY):"
cat "$SUMMARY"
exit $status
