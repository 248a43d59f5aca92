"""Compressed-model directory: save and load without the original weights.

Layout of ``path/``::

    model.safetensors   every tensor of model.state_dict() (packed int4, int8, float32 scales, BSR
                        indices and values, the dense layers), each stored once (aliases of tied
                        weights are listed in the manifest)
    config.json         the model's own ``transformers`` config (transformers models only)
    manifest.json       the layers' inference modules and configs, every tensor's dtype and shape,
                        each file's sha256 and one digest over it all (written last: a directory
                        without it is incomplete)

* :mod:`~compress.checkpoint.manifest`: the manifest's fields, its digest, the structure checks.
* :mod:`~compress.checkpoint.safe_write`: saves that never lose a user's files (refused paths, the
  crash-safe swap, :func:`recover`, normal file modes).
* :mod:`~compress.checkpoint.save`: :func:`save_compressed`.
* :mod:`~compress.checkpoint.load`: :func:`load_compressed`, :func:`load_model_dir`: every byte
  verified, cross-checked and refused with a :class:`CheckpointError` naming the file and field.
* :mod:`~compress.checkpoint.rebuild`: what both loaders share to rebuild a model.

``save_compressed(format="compressed-tensors")`` writes a Hugging Face model directory that vLLM and
``transformers`` load instead (W8A8 and W4A16 layers only), and :func:`load_compressed` reads any such
directory into our modules: :mod:`~compress.checkpoint.compressed_tensors` (the layout, the save, the
load).
"""
from compress.checkpoint.load import load_compressed, load_model_dir
from compress.checkpoint.manifest import (
    FORMAT_MARKER,
    FORMAT_VERSION,
    MANIFEST,
    MODEL_CONFIG,
    TENSORS,
    CheckpointError,
    is_our_checkpoint,
    read_manifest,
)
from compress.checkpoint.safe_write import check_save_target, checkpoint_path, recover
from compress.checkpoint.save import save_compressed

__all__ = [
    "FORMAT_MARKER",
    "FORMAT_VERSION",
    "MANIFEST",
    "MODEL_CONFIG",
    "TENSORS",
    "CheckpointError",
    "check_save_target",
    "checkpoint_path",
    "is_our_checkpoint",
    "load_compressed",
    "load_model_dir",
    "read_manifest",
    "recover",
    "save_compressed",
]
