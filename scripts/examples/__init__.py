"""Runnable examples of the public API (offline, CPU, under a minute each):
python -m scripts.examples.<name> --help."""
