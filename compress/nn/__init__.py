"""The ``nn.Module`` swaps built on :mod:`compress.core`.

* :mod:`compress.nn.qat`: ``CompressedLinear``, the training layer (fake quantization, block masks);
* :mod:`compress.nn.inference`: the inference layers that call the kernels, one file per scheme (W8A8,
  W4A16, W8A16, block-scaled W8A8, BSR, BSR + W8A8, BSR + W4A16);
* :mod:`compress.nn.fusion`: sibling layers (q/k/v, gate/up) fused into one kernel call;
* :mod:`compress.nn.input_quant`: norms and GELUs that hand the next W8A8 layer an int8 input;
* :mod:`compress.nn.block_chain`: block-scaled MLPs whose up-projection hands the down-projection
  ``gelu`` of its output in int8.

It imports nothing from :mod:`compress.lightning`, :mod:`compress.eval` or the CLI
(``tests/test_import_graph.py`` checks).
"""
