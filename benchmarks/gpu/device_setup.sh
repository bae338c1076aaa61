# Sourced at the start of every device call: the plugin's Python dependencies
# from carried wheels (fairseq-fixed's own cp312 wheel: building its sdist there cost
# 120 s of device time), ../shared/data from the carried copy.
T0=$(date +%s)
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/fairseq ]; then
  ls .whl/fairseq_fixed-*.whl > /dev/null || { echo "no fairseq-fixed wheel in .whl/: run bash benchmarks/gpu/fetch_wheels.sh here first" >&2; return 1; }
  # one pip call: each `--upgrade --target` call replaces /tmp/site/bin wholesale, so a
  # later call would drop the console scripts (subword-nmt, sacremoses) of an earlier one
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/antlr4-python3-runtime-4.9.3.tar.gz .whl/*.whl
fi
[ -e ../shared ] || ln -s "$PWD/.devdata" ../shared
# scripts/quickstart.sh (the quality harnesses' preprocessing) installs into and activates
# .venv: here that is the machine's python with the packages above, and nothing to install
if [ ! -e .venv/.installed ]; then
  mkdir -p .venv/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > .venv/bin/python
  chmod +x .venv/bin/python
  echo "export PATH=$PWD/.venv/bin:\$PATH" > .venv/bin/activate && touch .venv/.installed
fi
echo "setup took $(( $(date +%s) - T0 )) s"
python3 -c "import torch, numpy, fairseq; print(torch.__version__, numpy.__version__, fairseq.__version__, torch.cuda.get_device_name())"
which fairseq-train
# gpu_step CAP NAME cmd...: cmd under a timeout of CAP seconds or what is left of the call's
# GPU_BUDGET seconds (counted from this setup, 15 s kept to bring $OUT back), whichever is
# less; skipped under 20 s. One step that overruns then costs its own results, not the call's.
gpu_step() {
  local cap=$1 name=$2; shift 2
  local left=$(( ${GPU_BUDGET:-560} - 15 - ($(date +%s) - T0) ))
  local limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 20 ]; then echo "== $name: skipped, ${left} s left"; return; fi
  echo "== $name (timeout ${limit} s) at +$(( $(date +%s) - T0 )) s"
  local started=$(date +%s)
  timeout "$limit" "$@"; echo "== $name: rc $? in $(( $(date +%s) - started )) s"
}
