"""compressed-tensors model directories (the format vLLM and ``transformers`` read) for our W8A8 and
W4A16 layers, written by ``save_compressed(format="compressed-tensors")`` and read by
:func:`compress.load_compressed`.

* :mod:`~compress.checkpoint.compressed_tensors.format`: the layout: schemes, tensor names, int4 nibbles;
* :mod:`~compress.checkpoint.compressed_tensors.save`: the directory written, what the format cannot hold refused;
* :mod:`~compress.checkpoint.compressed_tensors.load`: any such directory read into our modules, no code run.
"""
