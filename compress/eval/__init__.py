"""Measuring models and kernels: the one timing harness (:mod:`compress.eval.timing`)."""
