# What made benchmarks/results/speed/gpu-nvidia-h200/ (see its README); it was that
# folder's gpu_session.sh, and .devdata/gpu_session.sh on the lent machine.
# The two device calls of 2026-11-26 (a record, run as .devdata/gpu_session.sh with .whl and .devdata
# carried): bash .devdata/gpu_session.sh 1 575, then bash .devdata/gpu_session.sh 2 405.
# usage: bash .devdata/gpu_session.sh PART SECONDS
set -uo pipefail
T0=$(date +%s)
PART=$1
BUDGET=$2
exec > >(tee -a "$OUT/session-$PART.log") 2>&1
source benchmarks/gpu/device_setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
uptime
step() { # step CAP NAME cmd...: runs with the smaller of CAP and what the budget leaves (20 s kept)
  local cap=$1 name=$2; shift 2
  local left=$(( BUDGET - 20 - ($(date +%s) - T0) ))
  local t=$(( cap < left ? cap : left ))
  if [ "$t" -lt 20 ]; then echo "== $name: skipped, ${left}s left"; return; fi
  echo "== $name (timeout ${t}s) at +$(( $(date +%s) - T0 ))s"
  local s=$(date +%s)
  timeout "$t" "$@"; echo "== $name: rc $? in $(( $(date +%s) - s ))s"
}
B="python3 -m benchmarks.run --device cuda --scale paper --repeats 3 --no-profile"
FLEXUSERS=rpr-preset,da-preset,window-preset,distance-mask,rpr,t5-bias,window-mw,window-mw-seg,da,alibi,kerple,sandwich,lm-rpr-preset,lm-da-preset,lm-window-preset
BIAS=rpr-preset,da-preset,window-preset,rope-preset,rpr,da,alibi,kerple,sandwich,t5-bias,fire,distance-mask
if [ "$PART" = 1 ]; then
  step 110 cuda-tests python3 -m pytest -q -p no:cacheprovider -n 8 -k cuda tests/test_flex.py tests/test_models.py tests/test_half_precision.py
  step 200 train-flex $B --sections train --out "$OUT/train-flex"
  step 150 memory-flex $B --sections memory --out "$OUT/memory-flex"
fi
if [ "$PART" = 2 ]; then
  step 150 train-flex $B --sections train --tasks translation --configs $BIAS --out "$OUT/train-flex"
  step 110 train-noflex $B --sections train --tasks translation --attention-flex never --configs $FLEXUSERS --out "$OUT/train-noflex"
  step 90 memory-flex $B --sections memory --out "$OUT/memory-flex"
  step 60 cuda-flex-test python3 -m pytest -q -p no:cacheprovider -x -k cuda tests/test_flex.py
fi
rm -f "$OUT"/fairseq_whl_part_*
# at most 8 files come back: keep each run's results.json (the rest is rebuilt from it)
find "$OUT" -mindepth 2 -type f ! -name results.json -delete
ls -R "$OUT"
