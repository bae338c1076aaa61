# What made benchmarks/results/speed/gpu-nvidia-h100-recompute/ (see its README); it was that
# folder's gpu_session.sh, and .devdata/gpu_session.sh on the lent machine.
# The device call of 2026-11-27, run as GPU_BUDGET=S bash .devdata/gpu_session.sh
# with .whl and .devdata carried (the data under .devdata/data is ../shared/data's).
set -uo pipefail
exec > >(tee -a "$OUT/session.log") 2>&1
source benchmarks/gpu/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
uptime
git rev-parse --short HEAD 2>/dev/null
gpu_step 210 cuda-tests python3 -m pytest -q -p no:cacheprovider -n 14 -k cuda --durations=10 tests/
OPS="python3 -m benchmarks.run --device cuda --scale paper --repeats 3 --no-profile --sections ops --op-modes fwd+bwd --configs alibi,t5-bias,kerple,sandwich"
gpu_step 60 ops-eager $OPS --attention-flex never --out "$OUT/ops-eager"
gpu_step 150 ops-flex $OPS --attention-flex auto --out "$OUT/ops-flex"
MEM="python3 -m benchmarks.run --device cuda --scale paper --repeats 1 --no-profile --tasks translation --sections memory"
gpu_step 60 memory-rope $MEM --configs rope-preset --out "$OUT/memory-rope"
gpu_step 200 memory-window $MEM --configs window-preset --out "$OUT/memory-window"
find "$OUT" -mindepth 2 -type f ! -name results.json -delete
ls -R "$OUT"
