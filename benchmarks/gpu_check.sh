#!/usr/bin/env bash
# GPU check of the Triton path (issue 4 item 6, issue 5 item 1): compiled-kernel
# correctness against plsh_ref (fp16/bf16/fp32, a tensor of > 2^31 elements), then the GPU
# table (n in 4k..256k, s in 4/16/64) against compiled FlexAttention exact ALiBi and the
# paper's reduction, forward and forward+backward. Needs one CUDA GPU with torch + triton
# already installed (nothing is installed). Finishes in < 8 minutes on an H200: a global
# budget (default 420 s) skips configurations that would start too late, and a hard
# timeout stops the run at 470 s. Results: $OUT/results.json and $OUT/results.md
# (default OUT=benchmarks/results/gpu-<date>). Extra arguments go to gpu_check.py
# (--dry-run plans and writes placeholder tables without a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/gpu-$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_PRINT_AUTOTUNING=0
PY="${PYTHON:-python3}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
timeout -k 10 470 "$PY" benchmarks/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/log.txt"
rc=${PIPESTATUS[0]}
echo "gpu_check exit status $rc; results in $OUT"
exit "$rc"
