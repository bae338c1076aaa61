"""Small fairseq models and batches for the model-level tests: the tiny models of
``benchmarks/tiny_models.py`` (the benchmarks measure the same ones), and the
fixtures made by earlier revisions of the plugin."""

import contextlib
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


@contextlib.contextmanager
def flex_setting(model, setting: str = None, on_cpu: bool = False):
    """Every attention module of ``model`` with ``--attention-flex setting`` (None: as built)
    and, with ``on_cpu``, taking the flex path on the CPU too where the flag takes it, so
    that flex's eager form runs there (the flag alone leaves the CPU alone)."""
    modules = [m for m in model.modules() if hasattr(m, "flex_on_cpu")]
    saved = [(m.attention_flex, m.flex_on_cpu) for m in modules]
    for m in modules:
        m.attention_flex = m.attention_flex if setting is None else setting
        m.flex_on_cpu = on_cpu or m.flex_on_cpu
    try:
        yield
    finally:
        for m, (attention_flex, flex_on_cpu) in zip(modules, saved):
            m.attention_flex, m.flex_on_cpu = attention_flex, flex_on_cpu
