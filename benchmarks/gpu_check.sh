#!/usr/bin/env bash
# A lent GPU's checks in one call, most important first, each with its own time limit so that
# what comes after still runs and every log is written:
#   1. the CUDA tests (tests/gpu: speculative decoding, parity with the CPU, bf16 sampling, the
#      codec, groups backends, a CUDA-graph round against the eager one with no host sync inside);
#   2. the round benchmark: eager against CUDA graphs, ar and pcg at batch 32, 1 and 8, on the
#      llasa-1b-shape preset (whose figures the GPU goals name) and then the kit
#      (benchmarks/bench_round.py: ops, launches, host and device ms, tokens/s per round; its result
#      files are written after every setting, so a stop at the time limit keeps what was measured);
#   3. the job-throughput benchmark on the llasa-1b-shape preset (slot utilisation and a job's
#      steady tokens/s against decoding alone: benchmarks/bench_job_throughput.py).
# Logs (versions.txt with nvidia-smi's report) and the result files land in $OUT (default
# work/gpu-check); where they are more than the 8 files a lent machine's call brings back, the
# logs are packed into logs.tar.gz at the end. Times of earlier calls are in
# benchmarks/results/gpu_check_*.md.
#
#   bash benchmarks/gpu_check.sh
#   BUDGET=300 ROUND_BUDGET=120 BENCH_ARGS="--workloads temps192" bash benchmarks/gpu_check.sh
#
# Environment: BUDGET (seconds for everything), TEST_BUDGET (seconds for step 1; 0 skips it),
# ROUND_BUDGET (seconds for step 2; 0 skips it), ROUND_ARGS (replaces step 2's arguments), PY (default
# .venv/bin/python, else python3), BENCH_ARGS (replaces step 3's arguments), SITE_TAR (a .tar.xz of
# site-packages unpacked into SITE_DIR, default /tmp/pcg-site, and put on PYTHONPATH: for a machine
# that has torch but lacks the project's other packages and cannot reach a registry;
# benchmarks/site_archive.sh builds it).
case "${1:-}" in -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-work/gpu-check}
BUDGET=${BUDGET:-580}
TEST_BUDGET=${TEST_BUDGET:-200}  # the CUDA-graph tests compile their rounds
ROUND_BUDGET=${ROUND_BUDGET:-200}
ROUND_ARGS=${ROUND_ARGS:---device cuda --models llasa-1b-shape,kit --modes none,cudagraphs --batches 32,1,8 --rounds 20 --row-rounds 64}
BENCH_ARGS=${BENCH_ARGS:---preset llasa-1b-shape --device cuda --batch 32 --scale 4 --threads 4 --workloads temps192,augment120}
mkdir -p "$OUT"
SECONDS=0
stage() { echo "[$(date +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$OUT/stages.log"; }

if [ -n "${SITE_TAR:-}" ]; then
  stage "unpacking $SITE_TAR"
  SITE_DIR=${SITE_DIR:-/tmp/pcg-site}
  mkdir -p "$SITE_DIR" && tar -xJf "$SITE_TAR" -C "$SITE_DIR" || exit 1
  export PYTHONPATH=$SITE_DIR:$ROOT${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}  # Ray's workers import the engine from here
fi
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONUNBUFFERED=1
"$PY" - >"$OUT/versions.txt" 2>&1 <<'PYEOF'
import importlib
import os
import torch
print("PYTHONPATH", os.environ.get("PYTHONPATH"))
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0))
for name in ("transformers", "ray", "pydantic", "pyarrow", "numpy", "boto3", "soundfile", "faiss"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:  # noqa: BLE001 - a report of what is there
        print(name, "missing:", type(e).__name__, e)
PYEOF
cat "$OUT/versions.txt"
{ echo; nvidia-smi 2>&1 || echo "no nvidia-smi"; } >>"$OUT/versions.txt"

if [ "$TEST_BUDGET" -gt 0 ]; then
  stage "1. CUDA tests (limit ${TEST_BUDGET}s)"
  timeout "$TEST_BUDGET" "$PY" -m pytest tests/gpu -v -p no:cacheprovider -rs >"$OUT/tests_gpu.log" 2>&1
  echo "rc=$?" >>"$OUT/tests_gpu.log"
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|rc=" "$OUT/tests_gpu.log" | tail -15
else
  stage "1. CUDA tests skipped (TEST_BUDGET=0)"
fi

LEFT=$((BUDGET - SECONDS - 70))  # step 3 keeps a minute at least
LIMIT=$((ROUND_BUDGET < LEFT ? ROUND_BUDGET : LEFT))
if [ "$ROUND_BUDGET" -eq 0 ]; then
  stage "2. round benchmark skipped (ROUND_BUDGET=0)"
elif [ "$LIMIT" -gt 60 ]; then
  stage "2. round: $ROUND_ARGS (limit ${LIMIT}s)"
  # shellcheck disable=SC2086 # ROUND_ARGS is a list of arguments
  timeout "$LIMIT" "$PY" benchmarks/bench_round.py $ROUND_ARGS --out "$OUT/round_cuda" >"$OUT/round.log" 2>&1
  echo "rc=$?" >>"$OUT/round.log"
  tail -30 "$OUT/round.log"
else
  stage "2. skipped: ${LIMIT}s left for it"
fi

LEFT=$((BUDGET - SECONDS - 10))
if [ "$LEFT" -gt 60 ]; then
  stage "3. job throughput: $BENCH_ARGS (limit ${LEFT}s)"
  # shellcheck disable=SC2086 # BENCH_ARGS is a list of arguments
  timeout "$LEFT" "$PY" benchmarks/bench_job_throughput.py $BENCH_ARGS --out "$OUT/job_throughput" \
    >"$OUT/bench.log" 2>&1
  echo "rc=$?" >>"$OUT/bench.log"
  grep -vE "^\(|WARNING|INFO" "$OUT/bench.log" | tail -40
else
  stage "3. skipped: ${LEFT}s left of the budget"
fi
stage "done"
# A lent machine's call brings back at most 8 files from $OUT: where there are more, the logs
# travel as one archive beside the result files
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  (cd "$OUT" && tar -czf logs.tar.gz -- *.log *.txt && rm -f -- *.log *.txt)
  echo "logs packed into $OUT/logs.tar.gz (at most 8 files come back from a lent machine)"
fi
