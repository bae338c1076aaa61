"""One module file per mechanism (its options, declarations and ``nn.Module``,
registered with :func:`fairseq_distattn.registry.register_attention`); every
module of this package is imported here, so a new file is a new mechanism.
No fairseq imports.
"""

import importlib
import pkgutil

from ..registry import REGISTRY, registered
from .base import Mechanism, MechanismConfig, Stack, shared_arguments

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in ("base", "__main__"):
        importlib.import_module(f"{__name__}.{_module}")

# SPEC name -> module class, in listing order
MECHANISM_REGISTRY = {info.name: info.module for info in registered()}
# each mechanism class under its own name (DistanceAware, RelativePosition, ...)
globals().update({info.module.__name__: info.module for info in registered()})


def build_mechanism(config: MechanismConfig) -> Mechanism:
    return REGISTRY[config.name].module(config)


__all__ = [
    "MECHANISM_REGISTRY",
    "Mechanism",
    "MechanismConfig",
    "Stack",
    "build_mechanism",
    "shared_arguments",
    *sorted({info.module.__name__ for info in registered()}),
]
