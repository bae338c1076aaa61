"""Small fairseq models and batches for the model-level tests: the tiny models of
``benchmarks/tiny_models.py`` (the benchmarks measure the same ones), and the
fixtures made by earlier revisions of the plugin."""

import sys
from pathlib import Path

from benchmarks.tiny_models import (  # noqa: F401 (the tests import them from here)
    TINY,
    TINY_LM,
    dictionary,
    everywhere,
    language_model,
    left_pad,
    parse,
    perturb_parameters,
    random_tokens,
    right_pad,
    translation_model,
)

OLD_CHECKPOINTS = Path(__file__).resolve().parent / "data" / "old_checkpoints"


def old_checkpoint_log_probabilities(name, overrides=None):
    """What today's code gives the sentence of ``tests/data/old_checkpoints/<name>.checkpoint``
    (made by an earlier plugin revision with ``make_fixture.py``, which computes it)."""
    sys.path.insert(0, str(OLD_CHECKPOINTS))
    try:
        from make_fixture import log_probabilities
    finally:
        sys.path.remove(str(OLD_CHECKPOINTS))
    return log_probabilities(OLD_CHECKPOINTS, name, overrides)
