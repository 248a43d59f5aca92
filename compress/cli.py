"""The ``compress`` console script: recipes (YAML read by ``LightningCLI``) run end to end.

Subcommands::

    compress run      --config RECIPE [--ckpt_path CKPT] [overrides]
                                                    fine-tune with the recipe's compression callbacks
                                                    (resumed from a Lightning checkpoint with
                                                    --ckpt_path: a file, or the directory of a
                                                    sharded FSDP2 checkpoint), export, evaluate, report
    compress fit      --config RECIPE [overrides]   plain LightningCLI fit (same recipe checks)
    compress validate --config RECIPE [overrides]   plain LightningCLI validate
    compress export   --config RECIPE --ckpt_path CKPT [--export_dir DIR] [--overwrite]
                      [--format compress|compressed-tensors]
                                                    Lightning checkpoint file -> compressed model dir
                                                    (--overwrite replaces an earlier export there;
                                                    compressed-tensors: a model dir for vLLM and
                                                    transformers, with the recipe's tokenizer)
    compress evaluate --config RECIPE --models DIR [DIR ...] [--names NAME ...] [--overwrite]
                                                    saved model dirs + the recipe's data -> report
                                                    (compress.output_dir/report.{md,json,png}; an
                                                    earlier report there is replaced only with
                                                    --overwrite)

A recipe has LightningCLI's sections (``model``, ``data``, ``trainer`` with ``callbacks``,
``seed_everything``) plus a ``compress`` section (:class:`CompressOptions`: output directory and
evaluation settings). ``--print_config``, dotted overrides (``--trainer.max_epochs=1``) and typed
validation come from LightningCLI; unknown keys and invalid values fail while parsing, and options are
never abbreviated (``--trainer.max_epoch`` is refused). Recipe files are read within bounds (at most
1 MiB of UTF-8 YAML whose aliases expand to at most 10,000 nodes: :mod:`compress.lightning.recipe_yaml`). Before any
training step, :func:`check_recipe` asks the compression plan of every callback to check the model
(e.g. a plan that matches no layer).

``run`` writes into ``compress.output_dir``: Lightning logs and checkpoints, the exported model dir
(the Export callback's ``dirpath``), ``float/`` (the run's fine-tuned float weights, when asked or
when the recipe exports nothing) and ``report.{md,json,png}`` comparing the run's float weights with
the exported compressed model.

Multi-device runs (``trainer.devices`` > 1 with DDP, or FSDP2 through ``ModelParallelStrategy``): Lightning
starts the other ranks by running the same command line again; after the fit every rank leaves the
process group and rank 0 alone goes on (float model, report).

Errors: a bad input (a path, a recipe value, a damaged checkpoint: ``ValueError``, ``TypeError``,
``OSError``, ``ImportError``, ``KeyError``) prints one line, ``compress COMMAND: error: TYPE: message``,
and exits 1; any other error prints its traceback and then that line, so the line that matters is
always last. A value the parser refuses is told by its innermost cause after the keys leading to it
(``RecipeError: sparsity: expected a fraction in [0, 1), got 1.5``), not by the parser's report of
every type it failed to be. ``COMPRESS_TRACEBACK=1`` prints the traceback for every error (with that
full report); any value but 0 or 1 is refused before the command runs. Python callers use
:func:`run_command`, which raises.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pickle
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LightningCLI

import compress
import compress.lightning.data  # noqa: F401  (see below)
import compress.lightning.tasks  # noqa: F401  (see below)
from compress.checkpoint import check_save_target, load_model_dir
from compress.checkpoint.save import SAVE_FORMATS
from compress.lightning.callbacks import Export, FloatWeightsSnapshot, target_model
from compress.lightning.data import load_tokenizer
from compress.lightning.recipe_yaml import bound_jsonargparse_yaml, check_config_files
from compress.nn.conv1d import linear_features
from compress.plan import Plan, linear_layer_names

# LightningCLI finds a short class name (``class_path: DigitsData``) among the subclasses imported
# when it parses: the imports above make every task, data module and callback a recipe can name known.

if TYPE_CHECKING:  # imported lazily at run time (evaluation pulls in more than the CLI needs)
    from compress.eval.evaluate import EvalOptions

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
    saves the run's fine-tuned float weights next to the compressed export;
    ``float32_matmul_precision`` is passed to ``torch.set_float32_matmul_precision`` (``"high"``
    lets float32 training use TF32 tensor cores on GPUs that have them). ``latency_mode``: how the
    report times a forward pass on CUDA: ``"cuda_graph"`` (default: replays of a captured CUDA
    graph, no Python launch overhead), ``"compile"`` (``torch.compile`` then the same capture) or
    ``"eager"``; on CPU timing is always eager (see :mod:`compress.eval.evaluate`). ``fuse_siblings``:
    evaluate compressed models with their query/key/value (and gate/up) layers fused into one
    kernel call each (:mod:`compress.nn.fusion`; the saved models are not changed).
    ``link_quantized_inputs``: W8A8 layers after a norm or GELU take their input already
    quantized by that op, one launch fewer each (:mod:`compress.nn.input_quant`; saved models unchanged),
    and block-scaled MLPs run up-projection -> GELU -> down-projection in int8 (:mod:`compress.nn.block_chain`).
    """

    def __post_init__(self):
        if self.float32_matmul_precision not in ("highest", "high", "medium"):
            raise ValueError(
                "compress.float32_matmul_precision: expected 'highest', 'high' or 'medium', "
                f"got {self.float32_matmul_precision!r}"
            )
        if not self.eval_batch_sizes or any(int(b) <= 0 for b in self.eval_batch_sizes):
            raise ValueError(f"compress.eval_batch_sizes: expected positive ints, got {self.eval_batch_sizes!r}")
        from compress.eval.evaluate import LATENCY_MODES

        if self.latency_mode not in LATENCY_MODES:
            raise ValueError(f"compress.latency_mode: expected one of {list(LATENCY_MODES)}, got {self.latency_mode!r}")

    output_dir: str = "runs/compress"
    eval_batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 32])
    latency_seq_len: Optional[int] = None
    latency_warmup: int = 5
    latency_repeats: int = 20
    max_eval_batches: Optional[int] = None
    eval_device: str = "auto"
    evaluate: bool = True
    save_float_model: bool = False
    float32_matmul_precision: str = "high"
    latency_mode: str = "cuda_graph"
    fuse_siblings: bool = True
    link_quantized_inputs: bool = True


class CompressCLI(LightningCLI):
    """LightningCLI with the ``compress`` section and recipe checks before fitting."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        super().__init__(*args, **kwargs)

    def init_parser(self, **kwargs):
        """LightningCLI's parser (main and subcommands) with :func:`parser_settings`."""
        return super().init_parser(**{**kwargs, **parser_settings()})

    def parse_arguments(self, parser, args) -> None:
        """Read the ``--config`` files within bounds (:func:`check_config_files`), then parse
        (:func:`recipe_errors`)."""
        if isinstance(args, (list, tuple)):
            check_config_files(list(args))
        with recipe_errors():
            super().parse_arguments(parser, args)

    def instantiate_classes(self) -> None:
        with recipe_errors():
            super().instantiate_classes()

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_class_arguments(CompressOptions, "compress")
        parser.link_arguments("compress.output_dir", "trainer.default_root_dir")

    def before_fit(self) -> None:
        torch.set_float32_matmul_precision(self.compress_options().float32_matmul_precision)
        check_recipe(self.model, self.trainer.callbacks)

    def compress_options(self) -> CompressOptions:
        config = self.config_init.get(self.subcommand, self.config_init) if self.subcommand else self.config_init
        return options_from(config)


def options_from(config) -> CompressOptions:
    """The ``compress`` section of an instantiated config as :class:`CompressOptions`."""
    section = config["compress"]
    if isinstance(section, CompressOptions):
        return section
    return CompressOptions(**dict(vars(section) if hasattr(section, "__dict__") else section))


# --- parsing recipes -----------------------------------------------------------------------------


class RecipeError(ValueError):
    """A recipe or command-line option the parser refused, told by the one message that matters."""


def parser_settings() -> dict:
    """Settings of every jsonargparse parser of the CLI (subcommand parsers inherit them): options are
    never abbreviated (``--trainer.max_epoch`` is refused, not read as ``--trainer.max_epochs``), and a
    refusal raises (turned into a :class:`RecipeError` by :func:`recipe_errors`) instead of printing the
    whole usage and exiting. Also makes jsonargparse load YAML within bounds (:mod:`compress.lightning.recipe_yaml`)."""
    bound_jsonargparse_yaml()
    return {"allow_abbrev": False, "exit_on_error": False}


_PARSER_KEY = re.compile(r'Parser key "([^"]+)"')
_CLASS_PATH = re.compile(r"Problem with given class_path '([^']+)'")


def _causes(error: BaseException) -> list[BaseException]:
    """``error`` and the chain of exceptions it was raised from (``raise ... from``), outermost first."""
    chain = [error]
    while chain[-1].__cause__ is not None and chain[-1].__cause__ not in chain:
        chain.append(chain[-1].__cause__)
    return chain


def _place(line: str) -> str | None:
    """The option key (``Parser key "trainer.callbacks"``) or class (``Problem with given class_path
    'a.b.QuantizationAware'``: ``QuantizationAware``) that a line of a jsonargparse error names, if any."""
    key = _PARSER_KEY.match(line)
    if key:
        return key.group(1)
    class_path = _CLASS_PATH.match(line)
    return class_path.group(1).rsplit(".", 1)[-1] if class_path else None


def _where(chain: list[BaseException]) -> list[str]:
    """The option keys and classes a jsonargparse error chain passes through, outermost first."""
    places = []
    for error in chain:
        place = _place(str(error).split("\n", 1)[0])
        if place and (not places or places[-1] != place):
            places.append(place)
    return places


def explain_parse_error(error: BaseException) -> str:
    """The message that matters of a parser error: the innermost cause (e.g. ``sparsity: expected a
    fraction in [0, 1), got 1.5`` raised by a callback's checks), after the keys and classes that lead
    to it, instead of jsonargparse's report of every type each value failed to be."""
    chain = _causes(error)
    innermost = chain[-1]
    message = " ".join(str(innermost).split()) or type(innermost).__name__
    if not isinstance(innermost, (ValueError, TypeError, KeyError, argparse.ArgumentError)):
        message = f"{type(innermost).__name__}: {message}"
    where = [place for place in _where(chain) if not message.startswith(place)]
    return " > ".join([*where, message]) if where else message


def _is_user_error(error: BaseException) -> bool:
    """Whether a parser error comes from the input (a value, an option, a file), not from a bug."""
    return isinstance(error, (argparse.ArgumentError, *USER_ERRORS))


@contextlib.contextmanager
def recipe_errors():
    """Parsing or building a recipe: an error whose innermost cause is a bad input (a value, an option,
    a file) is raised again as a :class:`RecipeError` holding :func:`explain_parse_error`'s message (the
    full report stays in its ``__cause__``, printed with ``COMPRESS_TRACEBACK=1``); an error that is its
    own cause is already the message that matters, and a bug's error passes unchanged."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - sorted below: user errors told in one line, bugs passed on
        chain = _causes(error)
        if (len(chain) == 1 and not isinstance(error, argparse.ArgumentError)) or not _is_user_error(chain[-1]):
            raise
        raise RecipeError(explain_parse_error(error)) from error


# --- recipe checks -------------------------------------------------------------------------------


def check_recipe(pl_module: pl.LightningModule, callbacks) -> None:
    """Raise ``ValueError`` before training when a callback's plan does not fit the model.

    Every callback with a compression ``plan`` (BlockPruning, QuantizationAware) must target at
    least one layer. Logged, not refused: what each config says a targeted layer's shape costs
    (``config.layer_shape_warning``: a W4A16 / W8A16 group size that does not divide ``in_features``
    pads K with zero channels; sparse layers whose sizes are not multiples of the block export dense).
    """
    model = target_model(pl_module)
    for callback in callbacks:
        plan = getattr(callback, "plan", None)
        if not isinstance(plan, Plan):
            continue
        where = type(callback).__name__
        targets = plan.targets(model)
        if not targets:
            raise ValueError(f"{where}: its plan matches no eligible linear layer of the model; linear layers "
                             f"(nn.Linear, Conv1D): {linear_layer_names(model)[:12]}")
        for name, configs in targets.items():
            in_features, out_features = linear_features(model.get_submodule(name))
            for config in configs:
                warning = config.layer_shape_warning(name, in_features, out_features)
                if warning is not None:
                    log.warning("%s: %s", where, warning)


# --- run -----------------------------------------------------------------------------------------


def export_callback(callbacks):
    """The recipe's ``compress.lightning.callbacks.Export`` callback, or None."""
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


def save_float_model(model, path: Path) -> Path:
    """Save a plain (uncompressed) model dir with ``compress.save_compressed`` (crash safe, checksummed);
    the ``float/`` of an earlier run into the same output dir is replaced, nothing else is. Its
    ``config.json`` has no ``quantization_config`` (a GGUF source's is dropped): a plain float checkpoint
    that ``transformers`` and llm-compressor load as such."""
    path = compress.save_compressed(model, path, overwrite=True, float_model=True)
    log.info("saved the float model to %s", path)
    return path


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


# What marks a sharded (FSDP2, ModelParallelStrategy) Lightning checkpoint directory.
SHARDED_CHECKPOINT_META = "meta.pt"


def is_sharded_checkpoint(path) -> bool:
    """Whether ``path`` is a sharded Lightning checkpoint: a directory of per-rank tensor files and ``meta.pt``."""
    return Path(path).is_dir() and (Path(path) / SHARDED_CHECKPOINT_META).is_file()


def checkpoint_option(args: list[str], command: str, sharded: bool = False) -> tuple[str | None, list[str]]:
    """``--ckpt_path CKPT`` taken out of ``args``: (the checkpoint or None, the other args). A missing
    file or more than one path fails here, before the recipe is built or any step is trained.
    ``sharded``: a sharded checkpoint directory (FSDP2) is accepted too."""
    ckpt, rest = _split_option(args, "ckpt_path")
    if len(ckpt) > 1:
        raise ValueError(f"compress {command}: expected at most one --ckpt_path CHECKPOINT, got {ckpt}")
    if ckpt and is_sharded_checkpoint(ckpt[0]) and not sharded:
        raise ValueError(f"compress {command}: --ckpt_path: {ckpt[0]!r} is a sharded (FSDP2) checkpoint directory, "
                         "whose metadata torch.distributed.checkpoint reads with pickle, which can run code; "
                         "export needs a checkpoint file it reads as plain data: if you trust the directory, "
                         "convert it with torch.distributed.checkpoint.format_utils.dcp_to_torch_save(DIR, FILE) "
                         "and pass FILE")
    if ckpt and not (Path(ckpt[0]).is_file() or (sharded and is_sharded_checkpoint(ckpt[0]))):
        kind = "file or sharded checkpoint directory" if sharded else "file"
        raise ValueError(f"compress {command}: --ckpt_path: expected an existing Lightning checkpoint {kind}, "
                         f"got {ckpt[0]!r}")
    return (ckpt[0] if ckpt else None), rest


def run(args: list[str]) -> int:
    """``compress run``: fit with the recipe's callbacks (resuming from ``--ckpt_path`` when given: the
    trainer's step, optimizer and the callbacks' schedules and masks come from the checkpoint, and so
    does the time ``trainer.max_time`` has counted; a sharded checkpoint directory of an FSDP2 run
    too, read by Lightning), export, evaluate, report."""
    ckpt_path, args = checkpoint_option(args, "run", sharded=True)
    cli = CompressCLI(args=args, run=False)
    options = options_from(cli.config_init)
    torch.set_float32_matmul_precision(options.float32_matmul_precision)
    check_recipe(cli.model, cli.trainer.callbacks)
    snapshot = FloatWeightsSnapshot()
    cli.trainer.callbacks.insert(0, snapshot)
    with _started_command_line():
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


def _leave_process_group() -> None:
    """End a multi-process fit's process group: rank 0 goes on alone (loading the export, evaluating), and
    nothing it runs then may wait for the other ranks (torchmetrics syncs its states when a group exists)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def fit(command: str, args: list[str]) -> int:
    """``compress fit`` / ``compress validate``: LightningCLI's own subcommands."""
    CompressCLI(args=[command, *args])
    return 0


# --- export --------------------------------------------------------------------------------------


def _split_option(args: list[str], name: str) -> tuple[list[str], list[str]]:
    """Remove ``--name V [V ...]`` / ``--name=V`` from ``args``; return (values, remaining args)."""
    values, rest, index = [], [], 0
    while index < len(args):
        arg = args[index]
        if arg == f"--{name}":
            index += 1
            while index < len(args) and not args[index].startswith("--"):
                values.append(args[index])
                index += 1
            continue
        if arg.startswith(f"--{name}="):
            values.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        index += 1
    return values, rest


def _unpickler_detail(message: str) -> str:
    """The one line of torch's multi-paragraph weights_only refusal that says what was refused."""
    tail = message.split("WeightsUnpickler error:", 1)[-1]
    line = next((line.strip() for line in tail.splitlines() if line.strip()), "refused by weights_only=True")
    return line.split(" was not an allowed global")[0]


def load_lightning_checkpoint(path) -> dict:
    """A Lightning checkpoint read with ``torch.load(weights_only=True)``: tensors and plain data only,
    so a pickled object that would run code is refused (and its code does not run)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        detail = _unpickler_detail(str(error))
        if detail.startswith("Unsupported global"):
            raise ValueError(f"{path}: refused to load: the checkpoint holds a pickled object that is not plain data "
                             f"({detail}); checkpoints are loaded without running any code they hold") from None
        raise ValueError(f"{path}: expected a Lightning checkpoint written by torch.save, got a file that "
                         f"torch.load(weights_only=True) refuses ({detail})") from None
    except (RuntimeError, EOFError, KeyError, ValueError, OSError) as error:
        raise ValueError(f"{path}: expected a Lightning checkpoint written by torch.save, got an unreadable file "
                         f"({type(error).__name__}: {error})") from None
    if not isinstance(state, dict) or "state_dict" not in state:
        found = sorted(state)[:8] if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{path}: expected a Lightning checkpoint with a 'state_dict', got {found}")
    return state


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


def _overwrite_flag(args: list[str]) -> tuple[bool, list[str]]:
    """``--overwrite`` (a flag, no value) taken out of ``args``: (whether it was given, the other args)."""
    rest = [arg for arg in args if arg != "--overwrite"]
    if any(arg.startswith("--overwrite=") for arg in rest):
        raise ValueError("compress export: --overwrite is a flag and takes no value")
    return len(rest) != len(args), rest


def _format_option(args: list[str]) -> tuple[str, list[str]]:
    """``--format NAME`` taken out of ``args``: (the save format, default ``compress``; the other args)."""
    formats, rest = _split_option(args, "format")
    if len(formats) > 1 or (formats and formats[0] not in SAVE_FORMATS):
        raise ValueError(f"compress export: --format: expected one of {SAVE_FORMATS}, got {formats}")
    return (formats[0] if formats else "compress"), rest


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
    export_dir, rest = _split_option(rest, "export_dir")
    save_format, rest = _format_option(rest)
    overwrite_values, rest = _overwrite_flag(rest)
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


# --- evaluate ------------------------------------------------------------------------------------

_IGNORED_BY_EVALUATE = ("model", "trainer", "seed_everything", "ckpt_path", "optimizer", "lr_scheduler")


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

    models, rest = _split_option(args, "models")
    names, rest = _split_option(rest, "names")
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


# --- entry point ---------------------------------------------------------------------------------


_STARTED_WITH: list[str] = []  # sys.argv as the process started, while _program_name has replaced it


@contextlib.contextmanager
def _program_name(command: str):
    """Let the parsers see ``compress <command>`` as the program and no other command-line args.

    LightningCLI and jsonargparse read ``sys.argv`` for the usage line and warn when it differs
    from the ``args`` they are given; the subcommand is dispatched here, so they get a clean argv.
    """
    saved = sys.argv
    _STARTED_WITH[:] = saved
    sys.argv = [f"compress {command}"]
    try:
        yield
    finally:
        sys.argv = saved


@contextlib.contextmanager
def _started_command_line():
    """``sys.argv`` as the process started, while Lightning may launch the other ranks of a multi-device
    run (DDP, FSDP): its launcher starts that command line again in each of them."""
    current = sys.argv
    sys.argv = list(_STARTED_WITH) or current
    try:
        yield
    finally:
        sys.argv = current


def main(argv: list[str] | None = None) -> int:
    """The ``compress`` command: :func:`run_command`, with errors reported by :func:`_report` (exit 1)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    try:
        show_tracebacks = tracebacks_asked()
    except ValueError as error:
        return _report(command, error, show_traceback=False)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run_command(argv)
    except Exception as error:  # noqa: BLE001 - reported, then the exit status says it failed
        return _report(command, error, show_tracebacks)


TRACEBACK_VARIABLE = "COMPRESS_TRACEBACK"


def tracebacks_asked() -> bool:
    """``$COMPRESS_TRACEBACK``: ``1`` prints the traceback of every error, ``0`` or unset only of unexpected ones.
    Any other value is refused (checked before the command runs, not when its first error comes)."""
    value = os.environ.get(TRACEBACK_VARIABLE, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"${TRACEBACK_VARIABLE}={value!r}: expected 0 or 1 (1: print the traceback of every error)")
    return value == "1"


def run_command(argv: list[str]) -> int:
    """Run ``compress ARGV`` and return its exit status; errors propagate (as they do to a caller in Python)."""
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(f"usage: compress <command> ...\n{USAGE}")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    with _program_name(command):
        return _dispatch(command, rest)


# Errors that a user's input causes (a path, a recipe value, a damaged checkpoint): their message is the
# whole story, so no traceback is printed. Anything else is a bug or a fault of the machine: traceback.
USER_ERRORS = (ValueError, TypeError, OSError, ImportError, KeyError)


def _report(command: str, error: Exception, show_traceback: bool = False) -> int:
    """Print ``error`` for a person: the traceback only for unexpected errors (or with ``show_traceback``:
    ``COMPRESS_TRACEBACK=1``), then always, as the last line, ``compress COMMAND: error: ...``. Exit 1."""
    if not isinstance(error, USER_ERRORS) or show_traceback:
        traceback.print_exception(error, file=sys.stderr)
    message = " ".join(str(error).split()) or "(no message)"
    sys.stderr.write(f"compress {command}: error: {type(error).__name__}: {message}\n")
    return 1


def _dispatch(command: str, rest: list[str]) -> int:
    if command == "run":
        return run(rest)
    if command in ("fit", "validate"):
        return fit(command, rest)
    if command == "export":
        return export(rest)
    if command == "evaluate":
        return evaluate(rest)
    sys.stderr.write(f"compress: unknown command {command!r}; expected run, fit, validate, export or evaluate\n{USAGE}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
