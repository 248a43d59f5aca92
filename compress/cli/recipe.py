"""A recipe on the command line: the ``compress`` section of a recipe (:class:`CompressOptions`), the
``LightningCLI`` that reads recipes (:class:`CompressCLI`), parser errors told by their cause
(:func:`recipe_errors`), the checks of a recipe against its model before training (:func:`check_recipe`),
and the command line the parsers and Lightning's launcher see.

A recipe has LightningCLI's sections (``model``, ``data``, ``trainer`` with ``callbacks``,
``seed_everything``) plus a ``compress`` section. ``--print_config``, dotted overrides
(``--trainer.max_epochs=1``) and typed validation come from LightningCLI; unknown keys and invalid
values fail while parsing, and options are never abbreviated (``--trainer.max_epoch`` is refused).
Recipe files are read within bounds (:mod:`compress.lightning.recipe_yaml`). A value the parser refuses
is told by its innermost cause after the keys leading to it (``RecipeError: sparsity: expected a
fraction in [0, 1), got 1.5``), not by the parser's report of every type it failed to be.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import re
import sys
from dataclasses import dataclass, field
from typing import Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LightningCLI

import compress.lightning.data  # noqa: F401  (see below)
import compress.lightning.tasks  # noqa: F401  (see below)
from compress.lightning.callbacks import target_model
from compress.lightning.recipe_yaml import bound_jsonargparse_yaml, check_config_files
from compress.nn.conv1d import linear_features
from compress.plan import Plan, linear_layer_names

# LightningCLI finds a short class name (``class_path: DigitsData``) among the subclasses imported
# when it parses: the imports above make every task, data module and callback a recipe can name known.

log = logging.getLogger(__name__)

# Errors that a user's input causes (a path, a recipe value, a damaged checkpoint): their message is the
# whole story, so no traceback is printed. Anything else is a bug or a fault of the machine: traceback.
USER_ERRORS = (ValueError, TypeError, OSError, ImportError, KeyError)


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


# --- the command line ----------------------------------------------------------------------------


_STARTED_WITH: list[str] = []  # sys.argv as the process started, while program_name has replaced it


@contextlib.contextmanager
def program_name(command: str):
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
def started_command_line():
    """``sys.argv`` as the process started, while Lightning may launch the other ranks of a multi-device
    run (DDP, FSDP): its launcher starts that command line again in each of them."""
    current = sys.argv
    sys.argv = list(_STARTED_WITH) or current
    try:
        yield
    finally:
        sys.argv = current


def flag_option(args: list[str], name: str, command: str) -> tuple[bool, list[str]]:
    """``--name`` (a flag, no value) taken out of ``args``: (whether it was given, the other args)."""
    rest = [arg for arg in args if arg != f"--{name}"]
    if any(arg.startswith(f"--{name}=") for arg in rest):
        raise ValueError(f"compress {command}: --{name} is a flag and takes no value")
    return len(rest) != len(args), rest


def split_option(args: list[str], name: str) -> tuple[list[str], list[str]]:
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
