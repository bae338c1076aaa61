"""``python -m fairseq_distattn.docs [--write]``: :mod:`fairseq_distattn.tools.docs`, beside
``check`` and ``inspect``."""

import sys

from .tools.docs import main

if __name__ == "__main__":
    sys.exit(main())
