"""The repository's command-line scripts, run as files (``python scripts/evaluate.py``).

A package only so that code run from the repository root (the benchmarks, the tests)
imports the modules the scripts share as ``scripts.mt_eval``; the scripts themselves
import each other from their own directory (``import mt_eval``).
"""
