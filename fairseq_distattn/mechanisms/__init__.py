"""One module file per mechanism (its options, declarations and ``nn.Module``,
registered with :func:`fairseq_distattn.registry.register_attention`); every
module of this package but the shared ones is imported here, so a new file is
a new mechanism. No fairseq imports.
"""

import importlib
import pkgutil

from ..registry import REGISTRY
from .base import Mechanism, MechanismConfig, Stack

# the modules every mechanism shares, and the entry point
SHARED_MODULES = ("__main__", "base", "examples")

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in SHARED_MODULES:
        importlib.import_module(f"{__name__}.{_module}")


def build_mechanism(
    name: str, num_heads: int, head_dim: int, options, stack: "Stack | None" = None, causal: "bool | None" = None
) -> Mechanism:
    """The module of mechanism ``name``, given its own options dataclass out of
    ``options``, the model-wide :class:`fairseq_distattn.spec.AttentionOptions`."""
    info = REGISTRY[name]
    return info.module(MechanismConfig(name, num_heads, head_dim, info.own_options(options), stack, causal))


__all__ = ["Mechanism", "MechanismConfig", "Stack", "build_mechanism"]
