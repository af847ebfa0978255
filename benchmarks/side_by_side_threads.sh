#!/usr/bin/env bash
# Wall time of QUAIL Adult training runs started 1, 2 and 3 at a time, with each process left at
# torch's default compute threads (one per core) and limited to one thread: what
# `benchmark --jobs N` gains by giving each cell its share of the CPUs.
#
# Usage: LIGHTNING_DPGAN_DATA_DIR=DIR bash benchmarks/side_by_side_threads.sh [OUT_DIR] [STEPS]
# (PYTHON picks the interpreter; defaults: runs/side-by-side-threads, 1500 steps).
set -euo pipefail
out=${1:-runs/side-by-side-threads}
steps=${2:-1500}
python=${PYTHON:-python}
mkdir -p "$out"

train() {  # seed, run folder
  "$python" -m lightning_dpgan train --model quail --dataset adult --epsilon 1 --delta 1e-5 --seed "$1" \
    --output-dir "$2" --overwrite --max-steps "$steps" --trainer.enable_progress_bar false > "$2.log" 2>&1
}

together() {  # how many, thread limit ("" for the default)
  local started ended seed
  started=$(date +%s.%N)
  for seed in $(seq 1 "$1"); do
    (
      if [ -n "$2" ]; then export OMP_NUM_THREADS=$2 MKL_NUM_THREADS=$2 OPENBLAS_NUM_THREADS=$2; fi
      train "$seed" "$out/run-$1-${2:-default}-$seed"
    ) &
  done
  wait
  ended=$(date +%s.%N)
  printf '%s at a time, threads %-7s %6.0f s\n' "$1" "${2:-default}" "$(awk "BEGIN { print $ended - $started }")"
}

for runs in 1 2 3; do
  together "$runs" ""
  together "$runs" 1
done
