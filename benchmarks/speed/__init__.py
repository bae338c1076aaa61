"""How fast? The speed benchmark (``python -m benchmarks.run``, :mod:`.run`): fairseq's
vanilla ``transformer`` / ``transformer_lm`` against every mechanism and paper preset of
the plugin, in training throughput (:mod:`.train`), beam-5 generation (:mod:`.generate`),
peak memory (:mod:`.memory`) and attention-op microbenchmarks (:mod:`.ops`), with the
window presets' cost floors (:mod:`.floor`); :mod:`.targets` judges the results against
the targets, :mod:`.report` and :mod:`.plot` write them, :mod:`.rpr_clipping` is a separate
check of rpr's clipping distance.
"""
