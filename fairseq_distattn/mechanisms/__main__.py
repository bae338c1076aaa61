"""``python -m fairseq_distattn.mechanisms``: :mod:`fairseq_distattn.tools.docs`."""

import sys

from ..tools.docs import main

if __name__ == "__main__":
    sys.exit(main())
