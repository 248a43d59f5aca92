"""Argument checks shared by the schedules (clear errors naming the argument, what was expected and what came)."""
from __future__ import annotations


def check_step(name: str, value) -> None:
    """ValueError unless ``value`` is a non-negative int (a step index)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name}: expected a non-negative int, got {value!r}")


def check_positive_int(name: str, value) -> None:
    """ValueError unless ``value`` is a positive int."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
