"""fairseq-distattn: distance-aware attention for fairseq (``--user-dir fairseq_distattn``).

Importing the package registers nothing by itself unless fairseq is in use:
``import fairseq_distattn.functional`` (pure torch) works without fairseq and
changes no global state of torch. The fairseq side (models, architectures,
flags in ``--help``, the flag check, checkpoint safe globals, torchrun on CPU)
is installed by :mod:`fairseq_distattn.models`, which is imported

- at once when fairseq is already imported (``fairseq-train --user-dir
  fairseq_distattn``, ``fairseq-generate``, hub loading: fairseq imports the
  user directory), or
- as soon as fairseq is imported later in this process (``import
  fairseq_distattn`` first, then fairseq: a one-shot import hook), or
- explicitly: ``import fairseq_distattn.models``.
"""

import importlib.abc
import importlib.util
import sys


def _fairseq_imported() -> bool:
    return sys.modules.get("fairseq") is not None


def _register_fairseq_side():
    from . import (
        criterions,  # noqa: F401 (registers the criteria: answer_cross_entropy)
        models,  # noqa: F401 (registers models, architectures and the fairseq hooks)
    )


def _initializing_here() -> bool:
    """Whether a module of this package is still running its own import (its
    registration would then import it circularly)."""
    return any(
        name.startswith(__name__ + ".") and getattr(getattr(module, "__spec__", None), "_initializing", False)
        for name, module in list(sys.modules.items())
    )


class _RegisterWhenFairseqIsImported(importlib.abc.MetaPathFinder):
    """Finds no module itself. When ``fairseq`` is about to be imported it wraps
    the real loader, so that the fairseq side is registered right after
    fairseq's own package has run; when that import came from a module of this
    package that is itself still being imported (``fairseq_distattn.modules``
    imports fairseq), registering then would import that module circularly, so
    it is done at the next import anywhere after that module has finished.
    Then it leaves ``sys.meta_path``."""

    def __init__(self):
        self.pending = False  # fairseq is imported; the fairseq side is not registered yet
        self.searching = False  # inside our own search for fairseq's spec

    def _register(self):
        self.pending = False
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _register_fairseq_side()

    def find_spec(self, fullname, path, target=None):
        if self.searching:
            return None
        if self.pending and not _initializing_here():
            self._register()
        if fullname != "fairseq" or self.pending or self not in sys.meta_path:
            return None
        self.searching = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_fairseq = spec.loader.exec_module

        def exec_module(module):
            run_fairseq(module)
            self.pending = True
            if not _initializing_here():
                self._register()

        spec.loader.exec_module = exec_module
        return spec


if _fairseq_imported():
    _register_fairseq_side()
elif "fairseq" not in sys.modules and not any(isinstance(f, _RegisterWhenFairseqIsImported) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWhenFairseqIsImported())
