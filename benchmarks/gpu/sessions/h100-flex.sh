# What made benchmarks/results/speed/gpu-nvidia-h100-flex/ (see its README); it was that
# folder's gpu_session.sh, and .devdata/gpu_session.sh on the lent machine.
# Call 1 of 2026-11-26 (evening), as run (then with the step helper inline, since moved to
# benchmarks/gpu/device_setup.sh as gpu_step): GPU_BUDGET=570 bash .devdata/gpu_session.sh,
# with .whl and .devdata carried (.devdata/data: ../shared/data's WMT and LM samples).
exec > >(tee -a "$OUT/session.log") 2>&1
source benchmarks/gpu/device_setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
B="python3 -m benchmarks.run --device cuda --scale paper --repeats 3 --train-repeats 3 --no-profile --tasks translation"
gpu_step 200 train-flex-a $B --sections train --configs alibi,kerple,sandwich,t5-bias --out "$OUT/train-flex-a"
gpu_step 200 train-flex-b $B --sections train --configs distance-mask,da,rpr --out "$OUT/train-flex-b"
gpu_step 130 memory-flex $B --sections memory --configs da-preset,window-preset,rope-preset --out "$OUT/memory-flex"
gpu_step 150 cuda-flex-tests python3 -m pytest -q -p no:cacheprovider -n 8 -k cuda tests/test_flex.py
# at most 8 files come back: each run's results.json (the rest is rebuilt from it) and the log
find "$OUT" -mindepth 2 -type f ! -name results.json -delete
# Call 2, on the still-warm machine (its command line, for the record):
#   source benchmarks/gpu/device_setup.sh; B=<as above>
#   timeout 110 $B --sections train --attention-flex never --configs alibi,kerple,sandwich,t5-bias,distance-mask --out $OUT/train-noflex
#   timeout <rest of 200 s> $B --sections memory --configs window-preset,rope-preset --out $OUT/memory
