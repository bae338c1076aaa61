#!/usr/bin/env bash
# On a lent GPU machine (the device tool), one call of at most GPU_BUDGET seconds:
#   GPU_BUDGET=470 bash benchmarks/gpu/speed_check.sh
# with [".whl", ".devdata"] carried (bash benchmarks/gpu/fetch_wheels.sh here first, and
# ../shared/data copied to .devdata/data). The CUDA tests, then the speed benchmark's
# memory and train sections at the presets' widths for every configuration that can take
# the flex path, once with `--attention-flex never` (eager) and once with `always` (every
# layer through compiled flex_attention). Each step has a cap (gpu_step), so one step that
# overruns costs its own results only. What comes back: each run's results.json and the
# log; `python -m benchmarks.speed.report --all <folder>/results.json` rebuilds the rest.
set -uo pipefail
cd "$(dirname "$0")/../.."
exec > >(tee -a "$OUT/session.log") 2>&1
source benchmarks/gpu/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
git rev-parse --short HEAD 2> /dev/null

# `--configs flex`: every candidate some of whose layers may take the flex path (from the
# registry); the memory section times the presets (rope-preset, fused SDPA, for reference)
PRESETS=rpr-preset,da-preset,window-preset,rope-preset
BENCH="python3 -m benchmarks.run --device cuda --scale paper --no-profile --tasks translation"
MEM="$BENCH --sections memory --repeats 1 --configs $PRESETS"
TRAIN="$BENCH --sections train --repeats 3 --train-repeats 3 --configs flex"

gpu_step 80 cuda-tests python3 -m pytest -q -p no:cacheprovider -n 14 -k cuda --durations=10 tests/
gpu_step 70 memory-eager $MEM --attention-flex never --out "$OUT/memory-eager"
gpu_step 100 train-eager $TRAIN --attention-flex never --out "$OUT/train-eager"
gpu_step 90 memory-flex $MEM --attention-flex auto --out "$OUT/memory-flex"
gpu_step 150 train-flex $TRAIN --attention-flex always --out "$OUT/train-flex"
# at most 8 files come back: each run's results.json (the rest is rebuilt from it) and the log
find "$OUT" -mindepth 2 -type f ! -name results.json -delete
ls -R "$OUT"
