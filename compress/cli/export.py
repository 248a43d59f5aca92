"""``compress export``: a Lightning checkpoint of a recipe's run -> a compressed model directory.

The checkpoint is read as plain data (:mod:`compress.cli.checkpoints`); the recipe's model is rebuilt,
each compression callback prepares it as in training, the checkpoint's weights and compression buffers
(masks, scales) load into it, and it is converted and saved (our format, or ``--format
compressed-tensors`` for vLLM and ``transformers``).
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import compress
from compress.checkpoint import check_save_target
from compress.checkpoint.save import SAVE_FORMATS
from compress.cli.checkpoints import checkpoint_option, load_lightning_checkpoint
from compress.cli.recipe import CompressCLI, check_recipe, flag_option, options_from, split_option
from compress.lightning.callbacks import Export, target_model
from compress.lightning.data import load_tokenizer

log = logging.getLogger(__name__)

EXPORT_HELP = """usage: compress export --config RECIPE --ckpt_path CKPT [--export_dir DIR] [--overwrite]
                       [--format compress|compressed-tensors] [recipe overrides]

A Lightning checkpoint of a run of RECIPE -> a compressed model directory (prints its path).

  --config RECIPE      the recipe the checkpoint was trained with (its model and compression callbacks)
  --ckpt_path CKPT     the Lightning checkpoint file (read as plain data: no pickled code runs)
  --export_dir DIR     where to write (default: the Export callback's dirpath, else
                       <compress.output_dir>/compressed)
  --overwrite          replace an earlier export in DIR (nothing else there is ever replaced)
  --format F           compress (default) or compressed-tensors (a model dir for vLLM and transformers,
                       W8A8 and W4A16 layers only, with the recipe's tokenizer)
  recipe overrides     as for compress run (compress run --help lists them)
"""


def _format_option(args: list[str]) -> tuple[str, list[str]]:
    """``--format NAME`` taken out of ``args``: (the save format, default ``compress``; the other args)."""
    formats, rest = split_option(args, "format")
    if len(formats) > 1 or (formats and formats[0] not in SAVE_FORMATS):
        raise ValueError(f"compress export: --format: expected one of {SAVE_FORMATS}, got {formats}")
    return (formats[0] if formats else "compress"), rest


def export_callback(callbacks):
    """The recipe's ``compress.lightning.callbacks.Export`` callback, or None."""
    found = [cb for cb in callbacks if isinstance(cb, Export)]
    if len(found) > 1:
        raise ValueError(f"trainer.callbacks: expected at most one Export callback, got {len(found)}")
    return found[0] if found else None


def _recipe_tokenizer(datamodule):
    """The tokenizer the recipe's data module tokenizes with (``tokenizer`` init arg), or None."""
    name = getattr(datamodule, "tokenizer_name", None)
    return None if name is None else load_tokenizer(name)


def export(args: list[str]) -> int:
    """``compress export --config RECIPE --ckpt_path CKPT [--export_dir DIR] [--overwrite] [--format F]``.

    Reads the checkpoint (plain data only: no pickled code runs), rebuilds the recipe's model, lets
    each compression callback prepare it exactly as in training, loads the checkpoint's weights and
    compression buffers (masks, scales) into it, converts to inference modules and saves.
    ``--export_dir`` defaults to the Export callback's ``dirpath``, else
    ``<compress.output_dir>/compressed``. An earlier export there is replaced only with
    ``--overwrite``; any other non-empty directory or file is never replaced. The target is checked
    before the weights are loaded and converted. ``--format compressed-tensors`` writes a model directory
    that vLLM and ``transformers`` load (W8A8 and W4A16 layers only; :func:`compress.save_compressed`),
    with the tokenizer of the recipe's data module when it has one.
    """
    if "-h" in args or "--help" in args:
        sys.stdout.write(EXPORT_HELP)
        return 0
    ckpt_path, rest = checkpoint_option(args, "export")
    export_dir, rest = split_option(rest, "export_dir")
    save_format, rest = _format_option(rest)
    overwrite_values, rest = flag_option(rest, "overwrite", "export")
    if ckpt_path is None:
        raise ValueError("compress export: expected one --ckpt_path CHECKPOINT, got none")
    if len(export_dir) > 1:
        raise ValueError(f"compress export: expected at most one --export_dir DIR, got {export_dir}")
    state = load_lightning_checkpoint(ckpt_path)
    cli = CompressCLI(args=rest, run=False)
    options = options_from(cli.config_init)
    callbacks = [cb for cb in cli.trainer.callbacks if hasattr(cb, "plan")]
    if not callbacks:
        raise ValueError("compress export: the recipe has no compression callback (BlockPruning, QuantizationAware)")
    check_recipe(cli.model, callbacks)
    for callback in callbacks:
        callback.setup(cli.trainer, cli.model, "fit")
    exporter = export_callback(cli.trainer.callbacks)
    default_dir = exporter.dirpath if exporter is not None else str(Path(options.output_dir) / "compressed")
    target = export_dir[0] if export_dir else default_dir
    check_save_target(target, overwrite_values, flag="--overwrite")
    cli.model.load_state_dict(state["state_dict"])
    model = compress.convert(target_model(cli.model))
    tokenizer = _recipe_tokenizer(cli.datamodule) if save_format == "compressed-tensors" else None
    path = compress.save_compressed(model, target, overwrite=overwrite_values, format=save_format, tokenizer=tokenizer)
    log.info("exported %s to %s", ckpt_path, path)
    sys.stdout.write(f"{path}\n")
    return 0
