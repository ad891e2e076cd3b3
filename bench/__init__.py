"""Benchmarks that print figures, not tests: run each from the repository's root as
``python -m bench.<name>`` (bench/common.py holds what they share)."""
