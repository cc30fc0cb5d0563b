"""Benchmarks run from the repo root with `python -m benchmarks.<name>` (see the Makefile)."""
