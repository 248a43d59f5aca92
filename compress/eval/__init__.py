"""Measuring models: quality, speed and memory, and the report that compares them.

* :mod:`compress.eval.timing`: the one timing harness (CUDA graphs, events, eager medians);
* :mod:`compress.eval.metrics`: the task metrics, shared with training;
* :mod:`compress.eval.evaluate`: one model's metrics, latency and weight memory;
* :mod:`compress.eval.report`: the report (Markdown, JSON, plot) over several models;
* :mod:`compress.eval.generate`: ``model.generate`` with a static cache and a compiled, graphed decode step.

It imports nothing from :mod:`compress.lightning` or the CLI (``tests/test_import_graph.py`` checks).
"""
