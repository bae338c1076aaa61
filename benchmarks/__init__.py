"""Benchmarks of fairseq-distattn against vanilla fairseq, one subpackage per question
(benchmarks/README.md lists every harness with its command and outputs):

- :mod:`benchmarks.speed`: how fast? Training and generation throughput, peak memory
  and attention ops (``python -m benchmarks.run``);
- :mod:`benchmarks.quality`: how good? BLEU and perplexity of trained models, and how
  they hold up on longer inputs than they were trained on;
- :mod:`benchmarks.diagnostics`: what did it learn? How far the mechanisms' parameters
  moved, what the trained window attends to, and the error of each op in half precision;
- ``benchmarks/gpu/``: the shell scripts that run the above on a lent GPU machine.

:mod:`benchmarks.common` holds what they all share: paths, command-line checks and the
machine description; :mod:`benchmarks.harness` what the harnesses that train and
evaluate models share: running the fairseq tools, run files and fingerprints, claims,
the statistics over seeds and the pieces of their reports; :mod:`benchmarks.tiny_models`
the tiny models the precision diagnostic measures (and the tests build theirs with).
BLEU is scored by :mod:`fairseq_distattn.tools.translation_scoring`, as
``scripts/evaluate.py`` scores it.
"""
