"""``python -m fairseq_distattn.mechanisms``: the older name of ``python -m
fairseq_distattn.docs`` (:mod:`fairseq_distattn.tools.docs`), kept as an alias."""

import sys

from ..tools.docs import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m fairseq_distattn.mechanisms"))
