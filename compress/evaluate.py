"""Measure a model's task quality, speed and weight memory, and load saved model directories.

For each model (the dense baseline and every compressed variant):

* task metrics on the evaluation split, with the same metric classes the tasks train with
  (:func:`compress.tasks.metrics_for`): accuracy and F1, or perplexity;
* latency: ``warmup`` untimed forward passes, then ``repeats`` timed ones on a fixed batch of
  ``batch_size`` random token sequences of ``seq_len`` tokens (all attended); the reported figure
  is the median, throughput = ``batch_size / median``. On CUDA each pass is timed with CUDA events
  (the host waits for the device), on CPU with ``time.perf_counter``;
* weight memory: bytes of every parameter and buffer of the linear layers (``nn.Linear`` and the
  compressed inference modules: packed int8 / int4 weights, scales, BSR indices and values), and
  of the whole model (shared tensors counted once).

On CUDA the model runs in fp16 (the kernels take fp16/bf16 activations): the whole model is cast,
and the inference modules keep their float32 scales float32 under the cast.
On CPU the model runs in float32, and the inference modules use the reference implementation.
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from compress.report import LatencyPoint, ModelResult
from compress.tasks import metrics_for

log = logging.getLogger(__name__)

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class EvalOptions:
    """How to evaluate: batch sizes for timing, sequence length, warm-up and timed repeats."""

    batch_sizes: tuple[int, ...] = (1, 8, 32)
    seq_len: int = 64
    warmup: int = 5
    repeats: int = 20
    max_eval_batches: int | None = None
    device: str = "auto"
    dtype: str = "auto"

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

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolved_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.float16 if self.resolved_device().type == "cuda" else torch.float32
        return _DTYPES[self.dtype]


def is_inference_module(module: nn.Module) -> bool:
    """True for the compressed inference modules of :mod:`compress.modules` (kernel-backed)."""
    from compress.modules import INFERENCE_MODULES

    return isinstance(module, tuple(INFERENCE_MODULES.values()))


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``nn.Linear`` layers and compressed inference modules (outermost only)."""
    found, inside = [], set()
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside):
            continue
        if isinstance(module, nn.Linear) or is_inference_module(module):
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
    seen = set()
    for t in list(module.parameters()) + list(module.buffers()):
        key = id(t) if t.layout != torch.strided else (t.data_ptr(), t.numel(), t.dtype)
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
def evaluate_metrics(model: nn.Module, dataloader, device: torch.device, max_batches: int | None = None, name: str = "") -> dict[str, float]:
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


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def median_latency_ms(model: nn.Module, inputs: dict, warmup: int, repeats: int, device: torch.device) -> float:
    """Median milliseconds of ``model(**inputs)`` over ``repeats`` timed calls after ``warmup`` calls."""
    for _ in range(warmup):
        model(**inputs)
    _synchronize(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(**inputs)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start_s = time.perf_counter()
            model(**inputs)
            times.append((time.perf_counter() - start_s) * 1000.0)
    return statistics.median(times)


def measure_latency(model: nn.Module, options: EvalOptions, device: torch.device, name: str = "") -> list[LatencyPoint]:
    """Median latency at every batch size of ``options``."""
    points = []
    for batch_size in tqdm(options.batch_sizes, desc=f"latency {name}".strip(), leave=False):
        inputs = latency_inputs(model, batch_size, options.seq_len, device)
        ms = median_latency_ms(model, inputs, options.warmup, options.repeats, device)
        points.append(LatencyPoint(batch_size, options.seq_len, ms))
    return points


def describe_compression(model: nn.Module) -> str:
    """A short summary such as ``"W8A8Linear x36, dense x1"`` of the linear layers."""
    counts: dict[str, int] = {}
    for _, layer in linear_layers(model):
        key = type(layer).__name__ if is_inference_module(layer) else "dense"
        counts[key] = counts.get(key, 0) + 1
    if set(counts) <= {"dense"}:
        return "dense"
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: kv[0] == "dense"))


def evaluate_model(name: str, model: nn.Module, dataloader, options: EvalOptions, source: str = "") -> ModelResult:
    """Metrics, latency and memory of one model, run on ``options``' device and dtype."""
    device, dtype = options.resolved_device(), options.resolved_dtype()
    model = cast_for_inference(model, device, dtype)
    linear_bytes, total_bytes = weight_memory(model)  # as it runs: after the cast
    metrics_module = metrics_for(model)
    log.info("evaluating %s on %s (%s)", name, device, dtype)
    metrics = evaluate_metrics(model, dataloader, device, options.max_eval_batches, name)
    latency = measure_latency(model, options, device, name)
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


def load_model_dir(path: str | Path) -> nn.Module:
    """A model from a saved directory: compressed (``compress.save_compressed``) or plain ``transformers``."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model dir: expected a directory, got {path}")
    from compress.checkpoint import MANIFEST, load_compressed

    if (path / MANIFEST).is_file():
        return load_compressed(path)
    return _load_plain_transformers(path)


def _load_plain_transformers(path: Path) -> nn.Module:
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    architectures = getattr(config, "architectures", None) or []
    if not architectures or not hasattr(transformers, architectures[0]):
        raise ValueError(f"{path}/config.json: expected 'architectures' naming a transformers class, got {architectures}")
    return getattr(transformers, architectures[0]).from_pretrained(path, dtype=torch.float32)
