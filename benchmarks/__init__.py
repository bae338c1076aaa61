"""Benchmark harness for fairseq-distattn (``python -m benchmarks.run``).

Compares fairseq's vanilla ``transformer`` / ``transformer_lm`` with every
distance-aware mechanism and paper preset of the plugin: training throughput,
beam-5 generation, peak memory and attention-op microbenchmarks. See
``benchmarks/README.md``.
"""
