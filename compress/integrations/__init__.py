"""Adapters that drive :class:`compress.schedule.CompressionSchedule` from other training frameworks.

* :mod:`compress.integrations.hf_trainer`: a ``transformers.TrainerCallback``.

(The Lightning callbacks live in :mod:`compress.lightning.callbacks`.) Importing this package imports
no framework; each adapter module imports its own.
"""
