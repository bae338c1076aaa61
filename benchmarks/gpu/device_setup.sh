# Sourced at the start of every device call: the plugin's Python dependencies
# from carried wheels (fairseq-fixed built there from its sdist once, brought
# back in 15 MB parts, carried since), ../shared/data from the carried copy.
T0=$(date +%s)
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
WHEEL=.devdata/fairseq_fixed-0.12.3.1-cp312-cp312-linux_x86_64.whl
if [ ! -d /tmp/site/fairseq ]; then
  if [ -e .devdata/fairseq_whl_part_aa ]; then cat .devdata/fairseq_whl_part_* > $WHEEL; fi
  if [ ! -e $WHEEL ]; then
    (unset CUDA_HOME; MAX_JOBS=16 python3 -m pip wheel -q --no-index --no-deps --no-build-isolation -w .devdata .whl/fairseq_fixed-0.12.3.1.tar.gz)
    split -b 15M $WHEEL $OUT/fairseq_whl_part_
  fi
  # one pip call: each `--upgrade --target` call replaces /tmp/site/bin wholesale, so a
  # later call would drop the console scripts (subword-nmt, sacremoses) of an earlier one
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/antlr4-python3-runtime-4.9.3.tar.gz .whl/*.whl $WHEEL
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
