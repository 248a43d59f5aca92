"""Checks of a saved schedule state against the schedule that loads it.

Every part of a :class:`compress.schedule.CompressionSchedule` records in its ``state_dict`` the
settings that define its run (``"settings"``: sparsity, score, step counts, ...) and, once bound to a
model, its layers with their configs (``"layers"``: ``{name: config.to_dict()}``). Loading checks them,
so a state from another model (same shapes, other layer names), from a run with other settings, or
with a negative step is refused with a ``ValueError`` that names what differs (the value this schedule
has and the value the state came with) instead of resuming a different run silently.

A resumed run keeps the settings it was saved with: a changed setting is refused, never applied to the
rest of the run nor silently ignored. States written before these records existed (no ``"settings"``
or ``"layers"``) load when the rest is consistent; a key missing from a saved ``"settings"`` is not
checked either, so states stay loadable when a setting is added later.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from compress.configs import config_from_dict
from compress.schedule.validation import check_step

_MISSING = "(not recorded)"


def check_mapping(where: str, state, required: tuple = ()) -> None:
    """ValueError unless ``state`` is a mapping holding every key of ``required``."""
    if not isinstance(state, Mapping):
        raise ValueError(f"{where}: expected the mapping state_dict() returns, got {type(state).__name__}")
    missing = [key for key in required if key not in state]
    if missing:
        raise ValueError(f"{where}: expected the mapping state_dict() returns, with {missing}, "
                         f"got keys {sorted(map(str, state))}")


def check_saved_step(where: str, key: str, value, allow_none: bool = False) -> None:
    """ValueError unless the saved ``value`` of ``key`` is a non-negative int (or None, if allowed)."""
    if value is None and allow_none:
        return
    check_step(f"{where}: saved {key}", value)


def check_saved_settings(where: str, ours: dict, saved) -> None:
    """ValueError naming the first setting of ``ours`` that the ``saved`` settings record otherwise.

    ``saved`` None (a state written before settings were recorded) and keys it lacks are not checked."""
    if saved is None:
        return
    check_mapping(f"{where}: saved settings", saved)
    for key, value in ours.items():
        if key in saved and saved[key] != value:
            raise ValueError(f"{where}: the saved state was made with {key}={saved[key]!r}, this schedule has "
                             f"{key}={value!r}; a resumed run keeps its settings: resume with {key}={saved[key]!r}, "
                             "or start a new run (from the saved weights, without this state)")


def check_saved_layers(where: str, ours: dict[str, Optional[dict]], saved) -> None:
    """ValueError unless the ``saved`` ``{layer name: config dict}`` names the layers of ``ours`` with the
    same configs (``saved`` None: a state written before layers were recorded, not checked; a field a saved
    config lacks counts at its default: :func:`_with_defaults`)."""
    if saved is None:
        return
    check_mapping(f"{where}: saved layers", saved)
    check_saved_layer_names(where, set(ours), set(saved))
    for name, config in ours.items():
        mine, theirs = _with_defaults(config), _with_defaults(saved[name])
        if theirs != mine:
            raise ValueError(f"{where}: layer {name!r}: {_first_difference(mine, theirs)}; a resumed run "
                             "keeps its settings: resume with the saved ones, or start a new run (from the saved "
                             "weights, without this state)")


def check_saved_layer_names(where: str, ours: set[str], saved: set[str]) -> None:
    """ValueError unless the saved layer names are those of this schedule's model."""
    if saved == ours:
        return
    raise ValueError(f"{where}: expected the state of this model's layers {_names(ours)}, got the state of layers "
                     f"{_names(saved)} (only in the state: {_names(saved - ours)}; only in this model: "
                     f"{_names(ours - saved)}); state from another model or plan?")


def _with_defaults(saved):
    """A saved config dict with the fields it lacks (added to its config class since it was written) at their
    defaults, so that a state saved before a new option existed still resumes; anything else unchanged."""
    if not isinstance(saved, Mapping) or "type" not in saved:
        return saved
    try:
        return config_from_dict(dict(saved)).to_dict()
    except (TypeError, ValueError):  # not a config this version reads: compared as saved, and refused
        return saved


def _first_difference(ours, saved) -> str:
    """'saved with k=a, this schedule has k=b' for the first key where two config dicts differ."""
    if not isinstance(ours, Mapping) or not isinstance(saved, Mapping):
        return f"saved with config {saved!r}, this schedule has {ours!r}"
    for key in [*ours, *(k for k in saved if k not in ours)]:
        mine, theirs = ours.get(key, _MISSING), saved.get(key, _MISSING)
        if mine != theirs:
            return f"saved with {key}={theirs!r}, this schedule has {key}={mine!r}"
    return f"saved with config {saved!r}, this schedule has {ours!r}"


def _names(names: set[str], shown: int = 4) -> str:
    listed = sorted(map(str, names))
    more = f" and {len(listed) - shown} more" if len(listed) > shown else ""
    return f"{listed[:shown]}{more}"
