"""``model.generate`` at the kernels' speed: a static KV cache and a compiled, CUDA-graphed decode step.

Eager ``generate`` (a dynamic cache, the default) pays Python for every op of every decode step:
each of a step's few hundred small launches costs host time that a batch-1 step of a compressed
model, a few milliseconds of GPU work, cannot hide. ``transformers``' own ``generate`` (5.x) removes
that when its generation config asks for it: with ``cache_implementation="static"`` it preallocates
the KV cache (``StaticCache``, tensors at fixed addresses) and, when ``compile_config`` allows the
device, runs every decode step through ``torch.compile(model.__call__, **compile_config.to_dict())``
(``GenerationMixin._valid_auto_compile_criteria`` / ``get_compiled_call``); the prefill, whose length
varies, stays eager. :func:`compile_for_generate` sets exactly that on ``model.generation_config``:

* ``mode="reduce-overhead"`` (CUDA): inductor's CUDA graph trees replay the whole decode step, so the
  step's host work is one graph launch. The inference modules' kernels are ``torch.library`` custom
  ops with fake implementations, so they trace into the graph like any ATen op;
* ``dynamic=False``: one graph per batch size and cache length (``generate`` keeps the cache length
  at the largest seen so far, so later calls with fewer new tokens reuse the graph);
* ``fullgraph=True``: a graph break would split the step into several graphs; better to fail loudly.

The first ``generate`` call of each batch size compiles (tens of seconds for a 30-layer model); each
call after it records the graph anew once (``generate`` makes a fresh cache per call, at new
addresses) and then replays it. Off CUDA the compiled step runs without graphs (``mode=None``),
which is what the CPU tests use, with ``backend="aot_eager"``.
"""
from __future__ import annotations

from torch import nn

CUDA_BACKEND, CUDA_MODE = "inductor", "reduce-overhead"


def compile_for_generate(model: nn.Module, *, backend: str | None = None, mode: str | None = None,
                         fullgraph: bool = True, dynamic: bool = False) -> nn.Module:
    """Make ``model.generate(...)`` use a static KV cache and a compiled decode step (module docstring).

    ``backend`` / ``mode``: ``torch.compile``'s; by default ``"inductor"`` everywhere, and
    ``"reduce-overhead"`` (CUDA graphs) on a CUDA model, the default mode elsewhere. Returns ``model``
    (changed in place: only its ``generation_config``). Undo with :func:`uncompile_for_generate`.
    """
    from transformers import CompileConfig

    if not hasattr(model, "generation_config"):
        raise TypeError(f"model: expected a transformers model with a generation_config (a GenerationMixin), "
                        f"got {type(model).__name__}")
    on_cuda = next(model.parameters()).device.type == "cuda"
    config = CompileConfig(fullgraph=fullgraph, dynamic=dynamic, backend=backend or CUDA_BACKEND,
                           mode=mode if mode is not None else (CUDA_MODE if on_cuda else None))
    config._compile_all_devices = True  # transformers compiles on CUDA only unless told (the CPU tests)
    model.generation_config.cache_implementation = "static"
    model.generation_config.compile_config = config
    model.generation_config.disable_compile = False
    return model


def uncompile_for_generate(model: nn.Module) -> nn.Module:
    """Back to ``transformers``' defaults: a dynamic cache and an eager decode step (the compiled call dropped)."""
    model.generation_config.cache_implementation = None
    model.generation_config.compile_config = None
    for name in ("_compiled_call", "_last_compile_config"):
        model.__dict__.pop(name, None)
    return model
