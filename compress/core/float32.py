"""``Float32Buffers``: a module mixin whose named float32 buffers survive ``.half()`` / ``.to(dtype)``.

Scales (``w_scale``, ``scales``, ``act_scale``), SmoothQuant factors and observer statistics must
stay float32 when a user casts the model (``model.half().cuda()``): a float16 scale would change the
quantized values the kernel computes. ``nn.Module._apply`` applies one function to every tensor, so
the mixin takes the protected buffers out, lets the cast run, and then moves them with that function
only if it keeps their dtype, else only to the new device.
"""
from __future__ import annotations

from torch import nn


class Float32Buffers(nn.Module):
    """Subclasses list the buffer names to protect in ``_float32_buffers``."""

    _float32_buffers: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        kept = {name: self._buffers.pop(name) for name in self._float32_buffers if self._buffers.get(name) is not None}
        try:
            super()._apply(fn, recurse)
        finally:
            for name, buffer in kept.items():
                moved = fn(buffer)
                self._buffers[name] = moved if moved.dtype == buffer.dtype else buffer.to(moved.device)
        return self
