"""The math of compression, on plain tensors and ``nn.Linear`` weights: no modules of this package.

* :mod:`compress.core.quant`: int8 / int4 quantization and packing, each with its inverse;
* :mod:`compress.core.sparsity`: 32x32 block scores, masks, the pruning schedule, BSR layout;
* :mod:`compress.core.observers`: activation statistics for static W8A8 scales;
* :mod:`compress.core.smoothquant`: migrating activation outliers into the weights;
* :mod:`compress.core.neuron_order`: listing MLP neurons so weak ones share blocks;
* :mod:`compress.core.float32`: buffers that stay float32 when a model is cast.

It imports nothing from :mod:`compress.nn`, :mod:`compress.lightning`, :mod:`compress.eval` or the
CLI (``tests/test_import_graph.py`` checks).
"""
