"""Command-line tools around trained models and the generated documentation:

- :mod:`.check`: ``python -m fairseq_distattn.check CHECKPOINT``, what a checkpoint needs;
- :mod:`.inspection`: ``python -m fairseq_distattn.inspect``, plots and a per-layer summary;
- :mod:`.docs`: ``python -m fairseq_distattn.docs [--write]``, the tables and
  grammar in docs/ that the registry gives;
- :mod:`.generated_blocks`: the generated copies of results files in the README and docs/;
- :mod:`.translation_scoring`: BLEU as the papers score it (``scripts/evaluate.py``, the
  translation benchmarks).
"""
