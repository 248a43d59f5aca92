"""Calibration observers: running statistics of a layer's input activations.

Each observer watches the activations ``x`` (..., K) that a quantizer will see and keeps, as
buffers (so they are part of the model's ``state_dict`` and of every Lightning checkpoint):

* ``channel_absmax`` (K,) float32: max |x[..., k]| over everything seen (SmoothQuant needs it),
* ``stat`` () float32: the statistic that becomes the static per-tensor scale ``stat / 127``,
* ``batches`` () int64: how many batches were seen.

Kinds (``stat`` after batch ``t`` with batch statistic ``a_t``):

* ``absmax``: ``max_t max|x_t|``,
* ``percentile``: the running mean of the per-batch ``p``-th percentile of ``|x_t|`` (clips
  rare outliers),
* ``moving_average``: ``stat_t = (1 - momentum) * stat_{t-1} + momentum * max|x_t|`` (first batch
  initialises it).

All kinds share one buffer layout, so one kind can replace another without changing the
``state_dict``. Under ``torch.distributed``, :meth:`Observer.sync_` all-reduces the buffers with
``max``, so every rank ends with the same scale.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from compress.core.float32 import Float32Buffers
from compress.core.quant import INT8_QMAX, safe_scale

OBSERVER_KINDS = ("absmax", "percentile", "moving_average")


class Observer(Float32Buffers):
    """Base class; subclasses define :meth:`batch_statistic` and :meth:`combine`."""

    kind = "base"
    _float32_buffers = ("channel_absmax", "stat")

    def __init__(self, num_channels: int):
        super().__init__()
        if not isinstance(num_channels, int) or num_channels <= 0:
            raise ValueError(f"num_channels: expected a positive int, got {num_channels!r}")
        self.register_buffer("channel_absmax", torch.zeros(num_channels))
        self.register_buffer("stat", torch.zeros(()))
        self.register_buffer("batches", torch.zeros((), dtype=torch.int64))

    def batch_statistic(self, abs_x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def combine(self, previous: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold one batch of activations (..., K) into the statistics."""
        if x.shape[-1] != self.channel_absmax.shape[0]:
            raise ValueError(f"observer: expected inputs (..., {self.channel_absmax.shape[0]}), got {tuple(x.shape)}")
        abs_x = x.detach().float().abs().reshape(-1, x.shape[-1])
        if abs_x.shape[0] == 0:
            return
        torch.maximum(self.channel_absmax, abs_x.amax(dim=0), out=self.channel_absmax)
        current = self.batch_statistic(abs_x)
        new = current if self.batches.item() == 0 else self.combine(self.stat, current)
        self.stat.copy_(new)
        self.batches += 1

    @torch.no_grad()
    def sync_(self) -> None:
        """All-reduce the statistics with ``max`` across processes (no-op without distributed)."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            for buffer in (self.channel_absmax, self.stat, self.batches):
                dist.all_reduce(buffer, op=dist.ReduceOp.MAX)

    def scale(self, qmax: int = INT8_QMAX) -> torch.Tensor:
        """The static per-tensor scale ``stat / qmax`` (float32 scalar, 1 if nothing was seen)."""
        return safe_scale(self.stat, qmax)

    def reset(self) -> None:
        self.channel_absmax.zero_()
        self.stat.zero_()
        self.batches.zero_()

    def extra_repr(self) -> str:
        return f"channels={self.channel_absmax.shape[0]}, batches={int(self.batches)}"


class AbsMaxObserver(Observer):
    kind = "absmax"

    def batch_statistic(self, abs_x):
        return abs_x.max()

    def combine(self, previous, current):
        return torch.maximum(previous, current)


class PercentileObserver(Observer):
    kind = "percentile"

    def __init__(self, num_channels: int, percentile: float = 99.99):
        super().__init__(num_channels)
        if not 0.0 < percentile <= 100.0:
            raise ValueError(f"percentile: expected a value in (0, 100], got {percentile}")
        self.percentile = float(percentile)

    def batch_statistic(self, abs_x):
        flat = abs_x.flatten()
        rank = min(max(math.ceil(self.percentile / 100.0 * flat.numel()), 1), flat.numel())
        return flat.kthvalue(rank).values

    def combine(self, previous, current):
        seen = self.batches.float()
        return (previous * seen + current) / (seen + 1)


class MovingAverageObserver(Observer):
    kind = "moving_average"

    def __init__(self, num_channels: int, momentum: float = 0.1):
        super().__init__(num_channels)
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"momentum: expected a value in (0, 1], got {momentum}")
        self.momentum = float(momentum)

    def batch_statistic(self, abs_x):
        return abs_x.max()

    def combine(self, previous, current):
        return (1.0 - self.momentum) * previous + self.momentum * current


def make_observer(kind: str, num_channels: int, percentile: float = 99.99) -> Observer:
    """An observer of ``kind`` (one of ``OBSERVER_KINDS``) for inputs with ``num_channels`` channels."""
    if kind == "absmax":
        return AbsMaxObserver(num_channels)
    if kind == "percentile":
        return PercentileObserver(num_channels, percentile)
    if kind == "moving_average":
        return MovingAverageObserver(num_channels)
    raise ValueError(f"observer: expected one of {OBSERVER_KINDS}, got {kind!r}")
