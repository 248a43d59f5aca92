"""The ``compress`` console script: recipes (YAML read by ``LightningCLI``) run end to end.

Subcommands::

    compress run      --config RECIPE [overrides]   fine-tune with the recipe's compression callbacks,
                                                    export, evaluate, report
    compress fit      --config RECIPE [overrides]   plain LightningCLI fit (same recipe checks)
    compress validate --config RECIPE [overrides]   plain LightningCLI validate
    compress export   --config RECIPE --ckpt_path CKPT [--export_dir DIR]
                                                    Lightning checkpoint -> compressed model dir
    compress evaluate --config RECIPE --models DIR [DIR ...] [--names NAME ...]
                                                    saved model dirs + the recipe's data -> report

A recipe has LightningCLI's sections (``model``, ``data``, ``trainer`` with ``callbacks``,
``seed_everything``) plus a ``compress`` section (:class:`CompressOptions`: output directory and
evaluation settings). ``--print_config``, dotted overrides (``--trainer.max_epochs=1``) and typed
validation come from LightningCLI; unknown keys and invalid values fail while parsing. Before any
training step, :func:`check_recipe` asks the compression plan of every callback to check the model
(e.g. a W4A16 group size that does not divide a targeted layer's ``in_features``).

``run`` writes into ``compress.output_dir``: Lightning logs and checkpoints, the exported model dir
(the Export callback's ``dirpath``), ``float/`` (the run's fine-tuned float weights, when asked or
when the recipe exports nothing) and ``report.{md,json,png}`` comparing the run's float weights with
the exported compressed model.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI

log = logging.getLogger(__name__)

USAGE = __doc__.split("Subcommands::")[1].split("A recipe has")[0]
FLOAT_MODEL_NAME = "float weights of this run"


@dataclass
class CompressOptions:
    """The recipe's ``compress`` section.

    ``output_dir`` receives logs, checkpoints, model dirs and the report (Lightning's
    ``trainer.default_root_dir`` follows it). ``eval_batch_sizes``: batch sizes timed in the report;
    ``latency_seq_len``: sequence length for timing (default: the data module's ``max_length`` /
    ``block_size`` / sequence length); ``max_eval_batches`` caps the evaluation split (None = all);
    ``eval_device``: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``; ``save_float_model``
    saves the run's fine-tuned float weights next to the compressed export.
    """

    output_dir: str = "runs/compress"
    eval_batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 32])
    latency_seq_len: Optional[int] = None
    latency_warmup: int = 5
    latency_repeats: int = 20
    max_eval_batches: Optional[int] = None
    eval_device: str = "auto"
    evaluate: bool = True
    save_float_model: bool = False


class CompressCLI(LightningCLI):
    """LightningCLI with the ``compress`` section and recipe checks before fitting."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_class_arguments(CompressOptions, "compress")
        parser.link_arguments("compress.output_dir", "trainer.default_root_dir")

    def before_fit(self) -> None:
        check_recipe(self.model, self.trainer.callbacks)

    def compress_options(self) -> CompressOptions:
        return options_from(self.config_init.get(self.subcommand, self.config_init) if self.subcommand else self.config_init)


def options_from(config) -> CompressOptions:
    """The ``compress`` section of an instantiated config as :class:`CompressOptions`."""
    section = config["compress"]
    if isinstance(section, CompressOptions):
        return section
    return CompressOptions(**dict(vars(section) if hasattr(section, "__dict__") else section))


# --- recipe checks -------------------------------------------------------------------------------


def compression_target(pl_module: pl.LightningModule):
    """The model the callbacks compress: ``pl_module.model`` when present, else ``pl_module``."""
    return getattr(pl_module, "model", pl_module)


def check_recipe(pl_module: pl.LightningModule, callbacks) -> None:
    """Raise ``ValueError`` before training when a callback's plan does not fit the model."""
    model = compression_target(pl_module)
    for callback in callbacks:
        if not type(callback).__module__.startswith("compress."):
            continue
        from compress import plan as plan_lib

        check = getattr(callback, "check_model", None)
        if callable(check):
            check(model)
            continue
        plan = plan_lib.plan_of(callback) if hasattr(plan_lib, "plan_of") else None
        if plan is not None:
            plan_lib.validate(model, plan)


# --- run -----------------------------------------------------------------------------------------


class FloatWeightsSnapshot(pl.Callback):
    """Keeps a copy of the task's model at the end of training, before any export converts it.

    ``on_train_end`` runs before every ``on_fit_end`` (where the Export callback converts), so the
    copy holds the fine-tuned float weights; training-only wrappers (fake quantization, masks) are
    replaced by plain ``nn.Linear`` layers holding the same (pruned) float weights.
    """

    def __init__(self):
        self.model = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.model = strip_training_modules(copy.deepcopy(compression_target(pl_module)).cpu())


def strip_training_modules(model):
    """Replace every training module (``compress.qat.CompressedLinear``) by its ``to_float()``."""
    from compress import qat

    for name, module in list(model.named_modules()):
        if isinstance(module, qat.CompressedLinear):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.to_float())
    return model


def export_callback(callbacks):
    """The recipe's ``compress.callbacks.Export`` callback, or None."""
    from compress.callbacks import Export

    found = [cb for cb in callbacks if isinstance(cb, Export)]
    if len(found) > 1:
        raise ValueError(f"trainer.callbacks: expected at most one Export callback, got {len(found)}")
    return found[0] if found else None


def default_seq_len(datamodule) -> int:
    """The sequence length the data module produces (for latency timing)."""
    for name in ("max_length", "block_size", "SEQ_LEN"):
        value = getattr(datamodule, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"compress.latency_seq_len: not set and {type(datamodule).__name__} has no max_length/block_size")


def eval_options(options: CompressOptions, datamodule) -> "EvalOptions":
    from compress.evaluate import EvalOptions

    return EvalOptions(
        batch_sizes=tuple(options.eval_batch_sizes),
        seq_len=options.latency_seq_len or default_seq_len(datamodule),
        warmup=options.latency_warmup,
        repeats=options.latency_repeats,
        max_eval_batches=options.max_eval_batches,
        device=options.eval_device,
    )


def save_float_model(model, path: Path) -> Path:
    """Save a plain ``transformers`` model dir (safetensors + config.json)."""
    model.save_pretrained(path)
    log.info("saved the float model to %s", path)
    return path


def build_report(named_models: list[tuple[str, Any, str]], datamodule, options: CompressOptions, stem: str = "report"):
    """Evaluate ``(name, model, source)`` triples on the data module's eval split; write the report."""
    from compress.evaluate import device_label, environment, evaluate_model
    from compress.report import Report, write_report

    settings = eval_options(options, datamodule)
    datamodule.setup("validate")
    loader = datamodule.val_dataloader()
    results = [evaluate_model(name, model, loader, settings, source) for name, model, source in named_models]
    device = settings.resolved_device()
    report = Report(results, device_label(settings), str(settings.resolved_dtype()).replace("torch.", ""), environment(device))
    paths = write_report(report, options.output_dir, stem)
    log.info("report written: %s", ", ".join(str(p) for p in paths.values()))
    return report, paths


def run(args: list[str]) -> int:
    """``compress run``: fit with the recipe's callbacks, export, evaluate, report."""
    import compress

    cli = CompressCLI(args=args, run=False)
    options = options_from(cli.config_init)
    check_recipe(cli.model, cli.trainer.callbacks)
    snapshot = FloatWeightsSnapshot()
    cli.trainer.callbacks.insert(0, snapshot)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    if not cli.trainer.is_global_zero:
        return 0
    output_dir = Path(options.output_dir)
    exporter = export_callback(cli.trainer.callbacks)
    models = [(FLOAT_MODEL_NAME, snapshot.model, "fine-tuned weights, fake quantization and masks off")]
    if exporter is None or options.save_float_model:
        save_float_model(snapshot.model, output_dir / "float")
    if exporter is not None:
        export_dir = Path(exporter.dirpath)
        models.append((f"compressed ({export_dir.name})", compress.load_compressed(export_dir), str(export_dir)))
    if options.evaluate:
        report, paths = build_report(models, cli.datamodule, options)
        sys.stdout.write(Path(paths["markdown"]).read_text())
    return 0


def fit(command: str, args: list[str]) -> int:
    """``compress fit`` / ``compress validate``: LightningCLI's own subcommands."""
    CompressCLI(args=[command, *args])
    return 0


# --- entry point ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _program_name(command: str):
    """Let the parsers see ``compress <command>`` as the program and no other command-line args.

    LightningCLI and jsonargparse read ``sys.argv`` for the usage line and warn when it differs
    from the ``args`` they are given; the subcommand is dispatched here, so they get a clean argv.
    """
    saved = sys.argv
    sys.argv = [f"compress {command}"]
    try:
        yield
    finally:
        sys.argv = saved


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(f"usage: compress <command> ...\n{USAGE}")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    with _program_name(command):
        return _dispatch(command, rest)


def _dispatch(command: str, rest: list[str]) -> int:
    if command == "run":
        return run(rest)
    if command in ("fit", "validate"):
        return fit(command, rest)
    if command == "export":
        from compress.cli_tools import export_main

        return export_main(rest)
    if command == "evaluate":
        from compress.cli_tools import evaluate_main

        return evaluate_main(rest)
    sys.stderr.write(f"compress: unknown command {command!r}; expected run, fit, validate, export or evaluate\n{USAGE}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
