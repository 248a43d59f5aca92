"""Training with Lightning: what the recipes name by class path.

* :mod:`compress.lightning.callbacks`: ``BlockPruning``, ``QuantizationAware``, ``Calibration``,
  ``Export`` and ``FloatWeightsSnapshot``; they orchestrate and call into the rest of ``compress``;
* :mod:`compress.lightning.tasks`: the ``transformers`` task modules (classification, causal LM);
* :mod:`compress.lightning.data`: the data modules (digits, text classification, language modeling);
* :mod:`compress.lightning.distill`: distillation from a frozen dense teacher;
* :mod:`compress.lightning.paths`: where models and data sets are found;
* :mod:`compress.lightning.recipe_yaml`: recipes (YAML) read within bounds, by the CLI and the scripts.

Importing this package does not import Lightning; its callbacks, tasks and data modules do.
"""
