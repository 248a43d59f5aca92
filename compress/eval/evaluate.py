"""Measure a model's task quality, speed and weight memory.

For each model (the dense baseline and every compressed variant):

* task metrics on the evaluation split, with the same metric classes the tasks train with
  (:func:`compress.eval.metrics.metrics_for`): accuracy and F1, or perplexity;
* latency: ``warmup`` untimed forward passes, then ``repeats`` timed ones on a fixed batch of
  ``batch_size`` random token sequences of ``seq_len`` tokens (all attended); the reported figure
  is the median, throughput = ``batch_size / median``. On CUDA each pass is timed with CUDA events
  (the host waits for the device), on CPU with ``time.perf_counter``. ``latency_mode`` picks what
  is timed (the same harness, :mod:`compress.eval.timing`, for every model of a report):

  - ``"cuda_graph"`` (default): ``model(**static_inputs)`` captured once per batch size in a
    ``torch.cuda.CUDAGraph`` under ``torch.no_grad()`` (after at least three warm-up forwards on a
    side stream, as the ``torch.cuda.graphs`` docs ask), then graph replays are timed: no Python
    launch overhead, as deployed with CUDA graphs / ``torch.compile``;
  - ``"compile"``: the same capture of ``torch.compile(model)`` (default inductor, static shapes);
  - ``"eager"``: plain ``model(**inputs)`` calls, Python overhead included.

  On CPU every mode times eager (there is nothing to capture). When capture fails for a model, that
  model is timed eager and its result says so (``latency_mode`` and ``latency_note``);
* weight memory: bytes of every parameter and buffer of the linear layers (``nn.Linear`` and the
  compressed inference modules: packed int8 / int4 weights, scales, BSR indices and values), and
  of the whole model (shared tensors counted once).

On CUDA the model runs in fp16 (the kernels take fp16/bf16 activations): the whole model is cast,
and the inference modules keep their float32 scales float32 under the cast. Compressed sibling
layers (query/key/value, gate/up) are then fused into one kernel call each
(:mod:`compress.nn.fusion`; ``fuse_siblings=False`` keeps them apart); dense layers are never fused,
so the dense baseline runs as ``transformers`` wrote it. W8A8 layers that read a norm's (LayerNorm,
Llama-family RMSNorm) or a GELU's output then take it already quantized from that op (:mod:`compress.nn.input_quant`,
``link_quantized_inputs=False`` keeps them quantizing it themselves); found with one forward pass. Under
the same option, block-scaled MLPs (``W8A8BlockLinear`` -> GELU -> ``W8A8BlockLinear``) are linked so the
up-projection hands the GELU's output to the down-projection in int8 (:mod:`compress.nn.block_chain`).
On CPU the model runs in float32, and the inference modules use the reference implementation.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from compress.eval.metrics import metrics_for
from compress.eval.report import LatencyPoint, ModelResult
from compress.eval.timing import capture_graph, median_ms, replay_ms, synchronize
from compress.nn.conv1d import is_linear_or_conv1d
from compress.nn.block_chain import link_block_chains, linked_chains
from compress.nn.fusion import SiblingGroup, fuse_siblings
from compress.nn.input_quant import link_quantized_inputs, linked_layers, takes_handed_input
from compress.nn.inference import W8A8BlockLinear, is_inference_module, kernels_run

log = logging.getLogger(__name__)

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
LATENCY_MODES = ("cuda_graph", "eager", "compile")


@dataclass
class EvalOptions:
    """How to evaluate: batch sizes for timing, sequence length, warm-up and timed repeats.

    ``latency_mode``: one of :data:`LATENCY_MODES` (see the module docstring); on CPU it resolves
    to ``"eager"``. ``fuse_siblings``: fuse the compressed query/key/value (and gate/up) layers of
    each model into one kernel call (:mod:`compress.nn.fusion`) before it is evaluated; dense layers
    stay as they are. ``link_quantized_inputs``: let a norm / GELU hand its output to the W8A8
    layer after it already quantized (:mod:`compress.nn.input_quant`), and a block-scaled up-projection hand
    ``gelu`` of its output to the down-projection in int8 (:mod:`compress.nn.block_chain`).
    """

    batch_sizes: tuple[int, ...] = (1, 8, 32)
    seq_len: int = 64
    warmup: int = 5
    repeats: int = 20
    max_eval_batches: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    latency_mode: str = "cuda_graph"
    fuse_siblings: bool = True
    link_quantized_inputs: bool = True

    def __post_init__(self):
        self.batch_sizes = tuple(self.batch_sizes)
        if not self.batch_sizes or any(not isinstance(b, int) or b <= 0 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes: expected positive ints, got {self.batch_sizes!r}")
        for name in ("seq_len", "repeats"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name}: expected a positive int, got {getattr(self, name)!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup: expected an int >= 0, got {self.warmup!r}")
        if self.dtype not in ("auto", *_DTYPES):
            raise ValueError(f"dtype: expected 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.latency_mode not in LATENCY_MODES:
            raise ValueError(f"latency_mode: expected one of {list(LATENCY_MODES)}, got {self.latency_mode!r}")

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolved_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.float16 if self.resolved_device().type == "cuda" else torch.float32
        return _DTYPES[self.dtype]

    def resolved_latency_mode(self) -> str:
        """``latency_mode`` on CUDA; ``"eager"`` on CPU (CUDA graphs need a GPU)."""
        return self.latency_mode if self.resolved_device().type == "cuda" else "eager"


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``nn.Linear`` (and transformers ``Conv1D``) layers and compressed inference modules (outermost only)."""
    found, inside = [], set()
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside):
            continue
        if is_linear_or_conv1d(module) or is_inference_module(module):
            found.append((name, module))
            inside.add(name)
    return found


def tensor_bytes(t: torch.Tensor) -> int:
    """Storage bytes of a dense or sparse (COO / CSR / BSR) tensor."""
    if t.layout == torch.strided:
        return t.numel() * t.element_size()
    if t.layout == torch.sparse_coo:
        return tensor_bytes(t._indices()) + tensor_bytes(t._values())
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return sum(tensor_bytes(p) for p in (t.crow_indices(), t.col_indices(), t.values()))
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return sum(tensor_bytes(p) for p in (t.ccol_indices(), t.row_indices(), t.values()))
    raise ValueError(f"tensor_bytes: unsupported layout {t.layout}")


def _unique_tensors(module: nn.Module):
    """``module``'s parameters and buffers, each storage once: a dense tensor whose storage an earlier one
    holds is a view of it (tied weights; the experts' buffers of a grouped ``QuantizedExperts``, views of
    the block's stacked buffers, which ``module.buffers()`` lists first)."""
    seen = set()
    for t in list(module.parameters()) + list(module.buffers()):
        key = id(t) if t.layout != torch.strided or t.is_meta else t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            yield t


def weight_memory(model: nn.Module) -> tuple[int, int]:
    """(bytes of the linear layers' parameters and buffers, bytes of the whole model's)."""
    linear = sum(tensor_bytes(t) for _, layer in linear_layers(model) for t in _unique_tensors(layer))
    total = sum(tensor_bytes(t) for t in _unique_tensors(model))
    return linear, total


def cast_for_inference(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Move ``model`` to ``device`` and cast its float tensors to ``dtype`` (eval mode).

    The inference modules keep their float32 scales float32 under a cast (their ``_apply`` does),
    while their bias and BSR values follow ``dtype`` as the kernels expect.
    """
    return model.to(device=device, dtype=dtype).eval()


def _to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@torch.inference_mode()
def evaluate_metrics(
    model: nn.Module, dataloader, device: torch.device, max_batches: int | None = None, name: str = ""
) -> dict[str, float]:
    """Task metrics of ``model`` over ``dataloader`` (at most ``max_batches`` batches)."""
    metrics = metrics_for(model).to(device)
    total = len(dataloader) if max_batches is None else min(max_batches, len(dataloader))
    for index, batch in enumerate(tqdm(dataloader, total=total, desc=f"eval {name}".strip(), leave=False)):
        if max_batches is not None and index >= max_batches:
            break
        batch = _to_device(batch, device)
        metrics.update(model(**batch), batch)
    return metrics.compute()


def latency_inputs(model: nn.Module, batch_size: int, seq_len: int, device: torch.device) -> dict:
    """A fixed batch of random token ids (seeded) with a full attention mask."""
    config = getattr(model, "config", None)
    vocab = int(getattr(config, "vocab_size", 2))
    max_positions = getattr(config, "max_position_embeddings", None)
    if max_positions is not None and seq_len > max_positions:
        raise ValueError(f"seq_len: expected <= the model's max_position_embeddings {max_positions}, got {seq_len}")
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab, (batch_size, seq_len), generator=generator)
    return {"input_ids": input_ids.to(device), "attention_mask": torch.ones_like(input_ids, device=device)}


def timed_forward(model: nn.Module, mode: str):
    """What a latency mode calls: ``model`` itself, or ``torch.compile(model)`` (default inductor)."""
    if mode != "compile":
        return model
    torch.compiler.reset()  # a fresh cache per model: its batch sizes do not count against another's recompiles
    return torch.compile(model, dynamic=False)


def latency_ms(forward, inputs: dict, options: EvalOptions, device: torch.device, mode: str) -> float:
    """Median milliseconds of ``forward(**inputs)`` in ``mode``: eager calls (under inference mode), or
    replays of a CUDA graph captured once (:mod:`compress.eval.timing`); ``options.warmup`` untimed
    calls or replays first."""
    if mode == "eager":
        with torch.inference_mode():
            return median_ms(lambda: forward(**inputs), device, options.warmup, options.repeats)
    graph, _ = capture_graph([lambda: forward(**inputs)], options.warmup)
    return replay_ms(graph, options.warmup, options.repeats)


def measure_latency(model: nn.Module, options: EvalOptions, device: torch.device, name: str = "",
                    mode: str = "eager") -> list[LatencyPoint]:
    """Median latency in ``mode`` at every batch size of ``options`` (raises if a capture fails)."""
    if mode not in LATENCY_MODES:
        raise ValueError(f"mode: expected one of {list(LATENCY_MODES)}, got {mode!r}")
    forward = timed_forward(model, mode)
    points = []
    for batch_size in tqdm(options.batch_sizes, desc=f"latency {name}".strip(), leave=False):
        inputs = latency_inputs(model, batch_size, options.seq_len, device)
        ms = latency_ms(forward, inputs, options, device, mode)
        points.append(LatencyPoint(batch_size, options.seq_len, ms))
    return points


def measure_latency_or_eager(model: nn.Module, options: EvalOptions, device: torch.device,
                             name: str = "") -> tuple[list[LatencyPoint], str, str]:
    """``(points, mode used, note)``: latency in ``options``' mode, or eager when that fails.

    A failed capture or compile (any error: they come as ``RuntimeError``, CUDA or dynamo errors)
    is logged as a warning and named in the note; the model is then timed eager, never silently.
    """
    mode = options.resolved_latency_mode()
    if mode == "eager":
        return measure_latency(model, options, device, name, "eager"), "eager", ""
    try:
        return measure_latency(model, options, device, name, mode), mode, ""
    except Exception as error:  # noqa: BLE001 - any capture failure means: time this model eager
        note = f"{mode} failed ({_root_cause(error)}); timed eager"
        log.warning("latency of %s: %s", name or type(model).__name__, note)
        synchronize(device)
        return measure_latency(model, options, device, name, "eager"), "eager", note


def _root_cause(error: BaseException) -> str:
    """``"Type: first line"`` of the innermost chained error (a failed capture re-raises on exit)."""
    while (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"


def describe_compression(model: nn.Module) -> str:
    """A short summary such as ``"W8A8Linear x36, dense x1"`` of the linear layers."""
    counts: dict[str, int] = {}
    for _, layer in linear_layers(model):
        key = type(layer).__name__ if is_inference_module(layer) else "dense"
        counts[key] = counts.get(key, 0) + 1
    if set(counts) <= {"dense"}:
        return "dense"
    summary = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: kv[0] == "dense"))
    groups = sum(isinstance(m, SiblingGroup) for m in model.modules())
    linked = linked_layers(model)
    chains = linked_chains(model)
    notes = ([f"{groups} fused sibling group{'s' if groups > 1 else ''}"] if groups else []) + (
        [f"{linked} fed int8 by the norm / GELU before"] if linked else []) + (
        [f"{chains} MLP chain{'s' if chains > 1 else ''} in int8"] if chains else [])
    return f"{summary} ({', '.join(notes)})" if notes else summary


def runs_reference(models: list[nn.Module], options: EvalOptions) -> bool:
    """Whether the compressed layers of ``models`` will run the pure-PyTorch reference of their kernels on
    ``options``' device and dtype (some model has an inference module, and the Triton kernels do not take
    such inputs: :func:`compress.nn.inference.kernels_run`), so that their latencies time the reference."""
    compressed = any(is_inference_module(m) for model in models for m in model.modules())
    return compressed and not kernels_run(options.resolved_device(), options.resolved_dtype())


def evaluate_model(name: str, model: nn.Module, dataloader, options: EvalOptions, source: str = "") -> ModelResult:
    """Metrics, latency and memory of one model, run on ``options``' device and dtype."""
    device, dtype = options.resolved_device(), options.resolved_dtype()
    model = cast_for_inference(model, device, dtype)
    if options.fuse_siblings:
        fuse_siblings(model)
    if options.link_quantized_inputs and any(takes_handed_input(m) for m in model.modules()):
        link_quantized_inputs(model, latency_inputs(model, 1, options.seq_len, device))
    if options.link_quantized_inputs and any(isinstance(m, W8A8BlockLinear) for m in model.modules()):
        link_block_chains(model, latency_inputs(model, 1, options.seq_len, device))
    linear_bytes, total_bytes = weight_memory(model)  # as it runs: after the cast
    metrics_module = metrics_for(model)
    log.info("evaluating %s on %s (%s), latency mode %s", name, device, dtype, options.resolved_latency_mode())
    metrics = evaluate_metrics(model, dataloader, device, options.max_eval_batches, name)
    latency, latency_mode, latency_note = measure_latency_or_eager(model, options, device, name)
    return ModelResult(
        name=name,
        metrics=metrics,
        primary_metric=metrics_module.primary,
        higher_is_better=metrics_module.higher_is_better,
        latency=latency,
        linear_weight_bytes=linear_bytes,
        total_weight_bytes=total_bytes,
        source=source,
        compression=describe_compression(model),
        latency_mode=latency_mode,
        latency_note=latency_note,
    )


def environment(device: torch.device) -> dict[str, str]:
    """Versions and device name recorded in every report."""
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:  # pragma: no cover
        pass
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def device_label(options: EvalOptions) -> str:
    device = options.resolved_device()
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"
