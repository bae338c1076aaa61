"""Packaging for fairseq-distattn, a fairseq plugin for distance-aware attention.

Use it with the fairseq command-line tools as ``--user-dir fairseq_distattn``.

Install with the constraints file, because the fairseq-fixed sdist is compiled
in an isolated build environment that would otherwise pull the newest (CUDA) torch::

    PIP_CONSTRAINT=constraints.txt pip install -e .[test]
"""

from pathlib import Path

from setuptools import find_packages, setup

README = Path(__file__).resolve().parent / "README.md"

setup(
    name="fairseq-distattn",
    version="0.1.0",
    description=(
        "Distance-aware attention for fairseq: relative position representations, "
        "distance-aware self-attention, differentiable windows, query-value "
        "interaction and distance masks"
    ),
    long_description=README.read_text(encoding="utf-8") if README.is_file() else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["fairseq_distattn", "fairseq_distattn.*"]),
    python_requires=">=3.8",
    install_requires=[
        # fairseq 0.12.2 does not install on Python 3.11+; fairseq-fixed 0.12.3.1 is
        # a fork of it that does (same `fairseq` import name and CLIs).
        "fairseq-fixed==0.12.3.1; python_version>='3.11'",
        "fairseq==0.12.2; python_version<'3.11'",
        "torch",
        # numpy 2 breaks fairseq's --sample-break-mode eos (and other code paths).
        "numpy<2",
        "sentencepiece",
        "subword-nmt",
        "sacrebleu",
        "sacremoses",
        # fairseq's --tensorboard-logdir writes nothing (one log line says so) without it
        "tensorboardX",
    ],
    extras_require={"test": ["pytest", "matplotlib"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
