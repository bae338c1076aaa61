#!/usr/bin/env bash
# Run here (with PyPI), from the repository root, before the first device call of a
# session: fills .whl/ with what benchmarks/gpu/device_setup.sh installs on the lent GPU
# machine, which has no network. That machine's image has Python 3.12, torch, numpy,
# sacrebleu, regex, sentencepiece, pytest and pytest-xdist (the device tool's
# KINDS.md); these are the rest of the plugin's dependencies, at the versions the
# constraints give here: fairseq-fixed's cp312 wheel (built against numpy 2, which that
# machine has; its torch extensions libbase/libnat serve only models the plugin does not
# use) and antlr4's runtime, a pure-Python sdist. About 22 MB; carry [".whl", ".devdata"].
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl .devdata
PY=${PYTHON:-.venv/bin/python}
WHEELS=(
    hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3 cffi==2.1.1 pycparser==3.12
    subword-nmt==0.3.8 sacremoses==0.2.0 mock==5.2.0 tensorboardX==2.6.5 click==8.5.1 joblib==1.6.0
    fairseq-fixed==0.12.3.1
)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${WHEELS[@]}"
# antlr4's runtime has no wheel: its sdist is built there
"$PY" -m pip download -q --no-deps --no-build-isolation --no-binary=:all: -d .whl \
    antlr4-python3-runtime==4.9.3
ls -la .whl
du -sh .whl
