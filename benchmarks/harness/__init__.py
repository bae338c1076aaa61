"""What the harnesses that train and evaluate models share, one module per concern.

- :mod:`.process`: running a fairseq tool or script with its output logged, and the
  environment the tools run in.
- :mod:`.claims`: one process per run directory (two harnesses on one ``--work``).
- :mod:`.grid`: the runs of a grid still to do, and training them under their claims.
- :mod:`.runs`: reading a harness's run files.
- :mod:`.fingerprints`: which model a result was evaluated from.
- :mod:`.training`: the optimiser recipe of every quality run, what a fairseq-train
  log says about its wall time, and how far the mechanisms' parameters moved.
- :mod:`.seeds`: the mean and spread over seeds, and how a table shows them.
- :mod:`.report`: the pieces of the markdown reports and the validation-curve plot
  that more than one harness writes.

The repository's paths, the command-line checks and the machine description are in
:mod:`benchmarks.common`, which the speed harness shares too. Nothing here imports a
harness: a harness imports from here (and ``common``), never another harness's
utilities.
"""
