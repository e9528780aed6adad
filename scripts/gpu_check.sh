#!/usr/bin/env bash
# The GPU check, one run on a lent GPU machine (issue 44; results in docs/benchmarks.md), from the repository root:
#
#   OUT=/tmp/gpu-check bash scripts/gpu_check.sh
#
# The engine tests with the device set to CUDA, in bfloat16 then float16 (token for token equal to `generate` on the
# same device and dtype: both batchers, chunked prefill, preemption on a tight pool, prefix hits), then the families
# and the CUDA-graph test in float32, run beside the benchmark's compile; the timed benchmark runs wait for them
# (python -m batching.bench gpu-check). Everything lands in $OUT as it comes; the last lines are the tests' verdicts
# and the benchmark's short table. Compiles fill TORCHINDUCTOR_CACHE_DIR (default /tmp/inductor-cache), packed into
# $OUT for a second run: unpack it there and point TORCHINDUCTOR_CACHE_DIR at it.
set -u
: "${OUT:?set OUT to the results folder}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}"
export BATCHSCOPE_ENGINE__COMPILE_AUTOTUNE=false
# Overridable for a dry run on a CPU: DEVICE=cpu BENCH_DTYPE=float32 SHAPE=qwen2-0.5b:1 TEST_DTYPES=bfloat16 ...
DEVICE="${DEVICE:-cuda}" BENCH_DTYPE="${BENCH_DTYPE:-bfloat16}" SHAPE="${SHAPE:-qwen2-0.5b}" REPEAT="${REPEAT:-3}"
TEST_DTYPES="${TEST_DTYPES-bfloat16 float16}" DEADLINE_S="${DEADLINE_S:-370}" WORKERS="${WORKERS:-10}"
TEST_LIMIT_S="${TEST_LIMIT_S:-85}" BENCH_FLAGS="${BENCH_FLAGS:-}"
read -r -a tests <<< "${TESTS:-tests/engine/test_families.py tests/engine/test_engine.py tests/engine/test_kv_memory.py \
tests/engine/test_equivalence.py tests/engine/test_cuda_graphs.py}"
read -r -a float32_tests <<< "${FLOAT32_TESTS:-tests/engine/test_families.py tests/engine/test_cuda_graphs.py}"
done_file="$(mktemp -u /tmp/gpu-check-tests-done.XXXX)"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/log.txt" 2>&1
(
  for dtype in $TEST_DTYPES; do
    # -v: each test's verdict as it ends, so a session cut off at its limit still says which ran and how
    BATCHSCOPE_TEST_DEVICE=$DEVICE BATCHSCOPE_TEST_DTYPE=$dtype timeout "$TEST_LIMIT_S" python3 -m pytest \
      -p no:cacheprovider -n "$WORKERS" --dist load -v --tb=line -rfE --durations=5 -m "not slow and not browser" \
      "${tests[@]}" > "$OUT/tests-$dtype.txt" 2>&1
  done
  # float32: the families and the CUDA graphs again, where rounding cannot tell a packed step from generate's
  BATCHSCOPE_TEST_DEVICE=$DEVICE BATCHSCOPE_TEST_DTYPE=float32 timeout "$TEST_LIMIT_S" python3 -m pytest \
    -p no:cacheprovider -n "$WORKERS" --dist load -v --tb=line -rfE -m "not slow and not browser" \
    "${float32_tests[@]}" > "$OUT/tests-float32.txt" 2>&1
  touch "$done_file"
) &
tests_pid=$!

python3 -m batching.bench gpu-check --out "$OUT" --wait-for "$done_file" --deadline-s "$DEADLINE_S" \
  --device "$DEVICE" --dtype "$BENCH_DTYPE" --model-shape "$SHAPE" --repeat "$REPEAT" $BENCH_FLAGS >> "$OUT/log.txt" 2>&1
wait "$tests_pid"
sed "/^gpu check summary:/,\$d" "$OUT/log.txt" | grep -v -E "^\s*$" | tail -c 6000
for dtype in $TEST_DTYPES float32; do
  file="$OUT/tests-$dtype.txt"
  echo "tests $dtype: $(grep -c ' PASSED ' "$file") passed, $(grep -c ' FAILED ' "$file") failed, $(grep -c ' ERROR ' "$file")" \
    "errors; $(grep -E '^=+ .*(passed|failed|error).* =+$' "$file" | tail -1)"
  grep -E '^(FAILED|ERROR) ' "$file" | cut -c1-150 | head -25
done
sed -n '/^gpu check summary:/,$p' "$OUT/log.txt"
