"""Benchmarks: `python -m experiments.bench.NAME` prints a table (docs/experiments.md)."""
