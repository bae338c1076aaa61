"""Pure tensor implementations of every mechanism (torch only: no fairseq
imports, and importing this package changes no global state of torch).

Shapes: ``q`` ``[B,H,Tq,D]``, ``k``/``v`` ``[B,H,Tk,D]``, unscaled (each op
applies 1/sqrt(D)); ``key_padding_mask`` ``[B,Tk]`` bool, True = padding;
``causal`` hides keys after the query; query row i sits at position
``query_offset + i`` and key j at position j. Every attention op takes
``key_padding_mask``, ``causal``, ``query_offset``, ``dropout_p``,
``need_weights`` and ``flex`` as keyword-only arguments after its tensors and returns
``(out [B,H,Tq,D], probs [B,H,Tq,Tk] or None when need_weights=False)``.
"""

import importlib as _importlib
import pkgutil as _pkgutil

# every module of this package (one per mechanism, plus the shared attention.py, masking.py,
# position_tables.py, paths.py and flex.py) exports its __all__ here, so a new mechanism's file
# is part of the API without an edit here (a mechanism stays two files). The package's own code
# imports each name from its module (``from ..functional.alibi import alibi_attention``), which
# editors and import readers follow; this namespace is the API for users.
__all__ = []
for _module in sorted(m.name for m in _pkgutil.iter_modules(__path__)):
    _exported = _importlib.import_module(f"{__name__}.{_module}")
    globals().update({name: getattr(_exported, name) for name in _exported.__all__})
    __all__ += _exported.__all__
__all__ = sorted(__all__)
