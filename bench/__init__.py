"""Benchmarks run by hand (``uv run python -m bench.NAME``); results are recorded in ``bench/README.md``."""
