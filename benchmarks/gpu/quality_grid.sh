#!/usr/bin/env bash
# On a lent GPU machine (the device tool), one call of at most SECONDS:
#   bash benchmarks/gpu/quality_grid.sh SECONDS [benchmarks.quality.mt flags ...]
# e.g. `bash benchmarks/gpu/quality_grid.sh 540 --precision amp --jobs 8 --updates 2000`.
# The base-scale quality grid, then the extrapolation of its models, outlast one call
# (10 minutes at most), and a machine left idle for 30 s is taken back with everything on
# it. So the grid runs detached (a call's end does not stop it) and every call, the
# first included, ends by copying the finished runs' files and tables into $OUT: what has
# finished comes back even if the next call finds a fresh machine. Call again at once to
# go on; a call that finds the grid still running only waits and copies. Copy $OUT's
# quality-base/ and extrapolation-base/ into benchmarks/results/ and commit them.
set -uo pipefail
cd "$(dirname "$0")/../.."
budget=${1:?usage: bash benchmarks/gpu/quality_grid.sh SECONDS [benchmarks.quality.mt flags ...]}
shift
start=$(date +%s)
source benchmarks/gpu/device_setup.sh
mkdir -p work
running() { [ -e work/gpu-quality-grid.pid ] && kill -0 "$(cat work/gpu-quality-grid.pid)" 2> /dev/null; }
if ! running; then
  # the flags are kept in work/ so that a call with none goes on with the first call's
  if [ $# -gt 0 ]; then printf '%q ' "$@" > work/gpu-quality-flags; fi
  flags=$(cat work/gpu-quality-flags 2> /dev/null)
  setsid nohup bash -c "python3 -m benchmarks.quality.mt --scale base --work work/quality $flags \
    && python3 -m benchmarks.quality.mt_extrapolation --scale base --quality-work work/quality" \
    >> work/gpu-quality-grid.log 2>&1 < /dev/null &
  echo $! > work/gpu-quality-grid.pid
fi
# leave time for the reports and the copy
while running && [ $(( $(date +%s) - start )) -lt $(( budget - 40 )) ]; do
  sleep 10
done
python3 -m benchmarks.quality.mt --scale base --report > /dev/null 2>&1
python3 -m benchmarks.quality.mt_extrapolation --scale base --report > /dev/null 2>&1
cp -r benchmarks/results/quality-base benchmarks/results/extrapolation-base "$OUT/" 2> /dev/null
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader
for log in work/quality/base/*/train.log; do
  [ -e "$log" ] && echo "$(basename "$(dirname "$log")"): $(grep -o 'num_updates=[0-9]*' "$log" | tail -n 1)"
done
tail -n 15 work/gpu-quality-grid.log
