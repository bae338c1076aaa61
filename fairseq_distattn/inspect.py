"""``python -m fairseq_distattn.inspect``: :mod:`fairseq_distattn.tools.inspection`."""

import sys

from .tools.inspection import main

if __name__ == "__main__":
    sys.exit(main())
