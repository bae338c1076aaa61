"""``python -m fairseq_distattn.check CHECKPOINT``: :mod:`fairseq_distattn.tools.check`."""

import sys

from .tools.check import main

if __name__ == "__main__":
    sys.exit(main())
