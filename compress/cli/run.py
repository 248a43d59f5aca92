"""``compress run`` (fit with the recipe's compression callbacks, export, evaluate, report) and
``compress fit`` / ``compress validate`` (LightningCLI's own subcommands).

``run`` writes into ``compress.output_dir``: Lightning logs and checkpoints, the exported model dir
(the Export callback's ``dirpath``), ``float/`` (the run's fine-tuned float weights, when asked or
when the recipe exports nothing) and ``report.{md,json,png}`` comparing the run's float weights with
the exported compressed model. An earlier run's export, ``float/`` or report there is refused before
training starts (:func:`check_run_targets`), unless ``--overwrite`` is given: a second run of a
recipe never replaces the first one's results silently, and never finds out after hours of training
that it cannot save.

Multi-device runs (``trainer.devices`` > 1 with DDP, or FSDP2 through ``ModelParallelStrategy``): Lightning
starts the other ranks by running the same command line again; after the fit every rank leaves the
process group and rank 0 alone goes on (float model, report).
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch

import compress
from compress.cli.checkpoints import checkpoint_option
from compress.cli.evaluate import build_report
from compress.cli.export import export_callback
from compress.checkpoint.safe_write import check_save_target
from compress.cli.recipe import CompressCLI, check_recipe, flag_option, options_from, started_command_line
from compress.eval.report import check_report_target
from compress.lightning.callbacks import FloatWeightsSnapshot

log = logging.getLogger(__name__)

FLOAT_MODEL_NAME = "float weights of this run"


def save_float_model(model, path: Path) -> Path:
    """Save a plain (uncompressed) model dir with ``compress.save_compressed`` (crash safe, checksummed);
    the ``float/`` of an earlier run into the same output dir is replaced, nothing else is. Its
    ``config.json`` has no ``quantization_config`` (a GGUF source's is dropped): a plain float checkpoint
    that ``transformers`` and llm-compressor load as such."""
    path = compress.save_compressed(model, path, overwrite=True, float_model=True)
    log.info("saved the float model to %s", path)
    return path


def run(args: list[str]) -> int:
    """``compress run``: fit with the recipe's callbacks (resuming from ``--ckpt_path`` when given: the
    trainer's step, optimizer and the callbacks' schedules and masks come from the checkpoint, and so
    does the time ``trainer.max_time`` has counted; a sharded checkpoint directory of an FSDP2 run
    too, read by Lightning), export, evaluate, report."""
    overwrite, args = flag_option(args, "overwrite", "run")
    ckpt_path, args = checkpoint_option(args, "run", sharded=True)
    cli = CompressCLI(args=args, run=False)
    options = options_from(cli.config_init)
    torch.set_float32_matmul_precision(options.float32_matmul_precision)
    check_recipe(cli.model, cli.trainer.callbacks)
    check_run_targets(cli.trainer.callbacks, options, overwrite)
    snapshot = FloatWeightsSnapshot()
    cli.trainer.callbacks.insert(0, snapshot)
    with started_command_line():
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
    _leave_process_group()
    if not cli.trainer.is_global_zero:
        return 0
    exporter = export_callback(cli.trainer.callbacks)
    if exporter is None or options.save_float_model:
        save_float_model(snapshot.model, Path(options.output_dir) / "float")
    models = [(FLOAT_MODEL_NAME, snapshot.model, "fine-tuned weights; fake quantization and masks off")]
    if exporter is not None:
        export_dir = Path(exporter.dirpath)
        named_by_parent = export_dir.name == "compressed" and export_dir.parent.name
        label = export_dir.parent.name if named_by_parent else export_dir.name
        models.append((f"compressed ({label})", compress.load_compressed(export_dir), str(export_dir)))
    if options.evaluate:
        _, paths = build_report(models, cli.datamodule, options)
        sys.stdout.write(Path(paths["markdown"]).read_text())
    return 0


def check_run_targets(callbacks, options, overwrite: bool) -> None:
    """Before training: ``FileExistsError`` when the run would replace an earlier run's export, ``float/``
    or report (unless ``overwrite``: ``--overwrite``), or could not save where the recipe says (a file, or
    a directory holding something else, is never replaced)."""
    exporter = export_callback(callbacks)
    if exporter is not None and exporter.save:
        check_save_target(exporter.dirpath, overwrite, flag="--overwrite")
    if exporter is None or options.save_float_model:
        check_save_target(Path(options.output_dir) / "float", overwrite, flag="--overwrite")
    if options.evaluate:
        check_report_target(options.output_dir, overwrite=overwrite, flag="--overwrite")


def _leave_process_group() -> None:
    """End a multi-process fit's process group: rank 0 goes on alone (loading the export, evaluating), and
    nothing it runs then may wait for the other ranks (torchmetrics syncs its states when a group exists)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def fit(command: str, args: list[str]) -> int:
    """``compress fit`` / ``compress validate``: LightningCLI's own subcommands."""
    CompressCLI(args=[command, *args])
    return 0
