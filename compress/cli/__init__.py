"""The ``compress`` console script: recipes (YAML read by ``LightningCLI``) run end to end.

Subcommands::

    compress run      --config RECIPE [--ckpt_path CKPT] [--overwrite] [overrides]
                                                    fine-tune with the recipe's compression callbacks
                                                    (resumed from a Lightning checkpoint with
                                                    --ckpt_path: a file, or the directory of a
                                                    sharded FSDP2 checkpoint), export, evaluate, report
                                                    (an earlier run's export, float/ or report in
                                                    the output dir is refused before training,
                                                    replaced only with --overwrite)
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

A recipe has LightningCLI's sections plus a ``compress`` section; the package's modules, one job each:

* :mod:`compress.cli.recipe`: the ``compress`` section (:class:`CompressOptions`), the ``LightningCLI``
  that reads recipes (:class:`CompressCLI`), parser errors told by their cause, :func:`check_recipe`
  (before any training step, every callback's compression plan checks the model);
* :mod:`compress.cli.run`: ``run``, ``fit``, ``validate``;
* :mod:`compress.cli.export`: ``export``, with :mod:`compress.cli.checkpoints` (``--ckpt_path``, checkpoint
  files read as plain data);
* :mod:`compress.cli.evaluate`: ``evaluate`` and the report ``run`` writes;
* here: the entry point (:func:`main`, the console script; ``python -m compress.cli``), the dispatch to
  the subcommands and how errors are reported.

Errors: a bad input (a path, a recipe value, a damaged checkpoint: ``ValueError``, ``TypeError``,
``OSError``, ``ImportError``, ``KeyError``) prints one line, ``compress COMMAND: error: TYPE: message``,
and exits 1; any other error prints its traceback and then that line, so the line that matters is
always last. ``COMPRESS_TRACEBACK=1`` prints the traceback for every error (with the parser's full
report); any value but 0 or 1 is refused before the command runs. Python callers use
:func:`run_command`, which raises.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback

from compress.cli import evaluate, export, run
from compress.cli.recipe import USER_ERRORS, CompressCLI, CompressOptions, RecipeError, check_recipe, program_name

USAGE = __doc__.split("Subcommands::")[1].split("A recipe has")[0]


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
    with program_name(command):
        return _dispatch(command, rest)


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
        return run.run(rest)
    if command in ("fit", "validate"):
        return run.fit(command, rest)
    if command == "export":
        return export.export(rest)
    if command == "evaluate":
        return evaluate.evaluate(rest)
    sys.stderr.write(f"compress: unknown command {command!r}; expected run, fit, validate, export or evaluate\n{USAGE}")
    return 2


__all__ = ["CompressCLI", "CompressOptions", "RecipeError", "check_recipe", "main", "run_command"]
