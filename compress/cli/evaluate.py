"""Models measured into one report: :func:`build_report` (what ``compress run`` does after the fit) and
the ``compress evaluate`` subcommand, which compares saved model directories on a recipe's data.

``compress evaluate --config RECIPE --models DIR [DIR ...] [--names NAME ...] [--overwrite]`` reads only
the recipe's ``data`` and ``compress`` sections and writes ``compress.output_dir/report.{md,json,png}``;
an earlier report there is refused, before any model loads, unless ``--overwrite`` is given.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import lightning.pytorch as pl

from compress.checkpoint import load_model_dir
from compress.cli.recipe import CompressOptions, options_from, parser_settings, recipe_errors, split_option
from compress.lightning.recipe_yaml import check_config_files

if TYPE_CHECKING:  # imported lazily at run time (evaluation pulls in more than the CLI needs)
    from compress.eval.evaluate import EvalOptions

log = logging.getLogger(__name__)

_IGNORED_BY_EVALUATE = ("model", "trainer", "seed_everything", "ckpt_path", "optimizer", "lr_scheduler")


def default_seq_len(datamodule) -> int:
    """The sequence length the data module produces (for latency timing)."""
    for name in ("max_length", "block_size", "SEQ_LEN"):
        value = getattr(datamodule, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"compress.latency_seq_len: not set and {type(datamodule).__name__} has no max_length/block_size")


def eval_options(options: CompressOptions, datamodule) -> "EvalOptions":
    """The recipe's ``compress`` section as evaluation settings (the sequence length from the data module
    unless ``latency_seq_len`` sets it)."""
    from compress.eval.evaluate import EvalOptions

    return EvalOptions(
        batch_sizes=tuple(options.eval_batch_sizes),
        seq_len=options.latency_seq_len or default_seq_len(datamodule),
        warmup=options.latency_warmup,
        repeats=options.latency_repeats,
        max_eval_batches=options.max_eval_batches,
        device=options.eval_device,
        latency_mode=options.latency_mode,
        fuse_siblings=options.fuse_siblings,
        link_quantized_inputs=options.link_quantized_inputs,
    )


def build_report(named_models: list[tuple[str, Any, str]], datamodule, options: CompressOptions, stem: str = "report"):
    """Evaluate ``(name, model, source)`` triples on the data module's eval split; write the report."""
    from compress.eval.evaluate import device_label, environment, evaluate_model, runs_reference
    from compress.eval.report import Report, write_report

    settings = eval_options(options, datamodule)
    reference = runs_reference([model for _, model, _ in named_models], settings)
    datamodule.setup("validate")
    loader = datamodule.val_dataloader()
    results = [evaluate_model(name, model, loader, settings, source) for name, model, source in named_models]
    device = settings.resolved_device()
    dtype = str(settings.resolved_dtype()).replace("torch.", "")
    report = Report(results, device_label(settings), dtype, environment(device), settings.resolved_latency_mode(),
                    reference_kernels=reference)
    paths = write_report(report, options.output_dir, stem)
    log.info("report written: %s", ", ".join(str(p) for p in paths.values()))
    return report, paths


def evaluate_parser():
    """Parser of ``compress evaluate``: the recipe's ``data`` and ``compress`` sections + model dirs."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(description="Evaluate saved model dirs on a recipe's data; write a report.",
                            **parser_settings())
    parser.add_argument("--config", action=ActionConfigFile, help="the recipe (its data and compress sections)")
    parser.add_argument("--models", type=list[str], required=True, help="saved model dirs, baseline first")
    parser.add_argument("--names", type=Optional[list[str]], default=None, help="report names (default: dir names)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the report.{md,json,png} of an earlier report in compress.output_dir")
    parser.add_subclass_arguments(pl.LightningDataModule, "data", required=True)
    parser.add_class_arguments(CompressOptions, "compress")
    for key in _IGNORED_BY_EVALUATE:
        parser.add_argument(f"--{key}", type=Any, default=None, help="recipe section, not used by evaluate")
    return parser


def evaluate(args: list[str]) -> int:
    """``compress evaluate --config RECIPE --models DIR [DIR ...] [--overwrite]``: compare saved models in one
    report, ``compress.output_dir/report.{md,json,png}``. An earlier report there is refused, before any model
    is loaded, unless ``--overwrite`` is given; the paths are logged before and after."""
    from compress.eval.report import check_report_target

    models, rest = split_option(args, "models")
    names, rest = split_option(rest, "names")
    parser = evaluate_parser()
    listed = [f"--models={json.dumps(models)}"] + ([f"--names={json.dumps(names)}"] if names else [])
    check_config_files(rest)
    with recipe_errors():
        config = parser.parse_args([*rest, *listed])
    if config.names is not None and len(config.names) != len(config.models):
        raise ValueError(f"--names: expected one name per model ({len(config.models)}), got {len(config.names)}")
    if not config.models:
        raise ValueError("--models: expected at least one model dir")
    paths = check_report_target(config.compress.output_dir, overwrite=config.overwrite, flag="--overwrite")
    log.info("compress evaluate: the report goes to %s%s", ", ".join(str(p) for p in paths.values()),
             " (replacing the earlier one)" if any(p.exists() for p in paths.values()) else "")
    with recipe_errors():
        init = parser.instantiate_classes(config)
    options = options_from(init)
    labels = config.names or [Path(m).name for m in config.models]
    loaded = [(label, load_model_dir(path), str(path)) for label, path in zip(labels, config.models)]
    _, paths = build_report(loaded, init.data, options)
    sys.stdout.write(Path(paths["markdown"]).read_text())
    return 0
