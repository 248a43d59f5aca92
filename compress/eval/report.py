"""The evaluation report: accuracy against speed and memory for a dense baseline and its variants.

A :class:`Report` holds one :class:`ModelResult` per model: task metrics on the evaluation split
(``accuracy`` / ``f1`` or ``perplexity``), latency points (median milliseconds per forward pass and
throughput in samples per second at each batch size) and weight memory (bytes of the parameters and
buffers of the linear layers, and of the whole model). The first model is the baseline that speed-ups
are relative to (``baseline latency / model latency`` at the same batch size). The report's
``latency_mode`` names the timing harness (``cuda_graph``: CUDA graph replays, ``compile``: a
``torch.compile`` forward captured in a CUDA graph, ``eager``: plain forward calls with their Python
launch overhead); a model whose capture failed was timed eager, and its ``latency_mode`` and
``latency_note`` say so (a note under the Markdown table). ``reference_kernels``: the compressed layers
ran the pure-PyTorch reference of their kernels (``kernels/reference.py``: the Triton kernels take CUDA
fp16/bf16 inputs only), so their latencies time that reference; a note under the table says so.

Writers, each a pure function of the report:

* :func:`to_markdown` / :func:`write_markdown`: a table, one row per model;
* :func:`write_json` / :func:`read_json`: the whole report, round trip;
* :func:`plot_accuracy_vs_speed`: a PNG (matplotlib, Agg backend) with throughput at one batch
  size on the x axis and the primary metric on the y axis, one labelled point per model
  (:func:`accuracy_vs_speed_figure`; labels placed by :func:`place_labels`);
* :func:`write_report`: all three into a directory (:func:`check_report_target` first, to refuse
  replacing an earlier report).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

# latency_mode / latency_note / reference_kernels were added with defaults: version-1 files still read.
FORMAT_VERSION = 1
REPORT_SUFFIXES = {"markdown": ".md", "json": ".json", "plot": ".png"}
MIB = 1024 * 1024
LATENCY_MODE_WORDS = {
    "cuda_graph": "CUDA graph replays of the captured forward (no Python launch overhead)",
    "compile": "CUDA graph replays of the torch.compile (inductor) forward",
    "eager": "eager forward calls (Python launch overhead included; the only mode on CPU)",
}


@dataclass
class LatencyPoint:
    """Median latency of one forward pass on ``batch_size`` sequences of ``seq_len`` tokens."""

    batch_size: int
    seq_len: int
    latency_ms: float

    @property
    def throughput(self) -> float:
        """Samples (sequences) per second."""
        return self.batch_size / (self.latency_ms / 1000.0) if self.latency_ms > 0 else float("inf")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "throughput": self.throughput}


@dataclass
class ModelResult:
    """Everything measured for one model."""

    name: str
    metrics: dict[str, float]
    primary_metric: str
    higher_is_better: bool
    latency: list[LatencyPoint]
    linear_weight_bytes: int
    total_weight_bytes: int
    source: str = ""
    compression: str = "dense"
    latency_mode: str = "eager"
    latency_note: str = ""

    def latency_at(self, batch_size: int) -> LatencyPoint | None:
        return next((p for p in self.latency if p.batch_size == batch_size), None)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["latency"] = [p.to_dict() for p in self.latency]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "ModelResult":
        fields = dict(data)
        points = [
            LatencyPoint(p["batch_size"], p["seq_len"], p["latency_ms"]) for p in fields.pop("latency")
        ]
        return cls(latency=points, **fields)


@dataclass
class Report:
    """Results for several models measured in one process on one device."""

    models: list[ModelResult]
    device: str
    dtype: str
    environment: dict[str, str] = field(default_factory=dict)
    latency_mode: str = "eager"
    reference_kernels: bool = False

    def __post_init__(self):
        if not self.models:
            raise ValueError("Report: expected at least one ModelResult, got none")
        if self.latency_mode not in LATENCY_MODE_WORDS:
            raise ValueError(f"Report: latency_mode expected one of {list(LATENCY_MODE_WORDS)}, "
                             f"got {self.latency_mode!r}")
        primaries = {m.primary_metric for m in self.models}
        if len(primaries) != 1:
            raise ValueError(f"Report: models must share one primary metric, got {sorted(primaries)}")

    @property
    def baseline(self) -> ModelResult:
        return self.models[0]

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({p.batch_size for m in self.models for p in m.latency})

    def speedup(self, model: ModelResult, batch_size: int) -> float | None:
        """Baseline latency / ``model`` latency at ``batch_size`` (None when either is missing)."""
        ours, base = model.latency_at(batch_size), self.baseline.latency_at(batch_size)
        if ours is None or base is None or ours.latency_ms <= 0:
            return None
        return base.latency_ms / ours.latency_ms

    def to_dict(self) -> dict:
        return {
            "format_version": FORMAT_VERSION,
            "device": self.device,
            "dtype": self.dtype,
            "environment": dict(self.environment),
            "latency_mode": self.latency_mode,
            "reference_kernels": self.reference_kernels,
            "baseline": self.baseline.name,
            "models": [m.to_dict() for m in self.models],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Report":
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(f"report format_version: expected {FORMAT_VERSION}, got {version!r}")
        models = [ModelResult.from_dict(m) for m in data["models"]]
        return cls(models, data["device"], data["dtype"], data.get("environment", {}),
                   data.get("latency_mode", "eager"), data.get("reference_kernels", False))


def _metric_names(report: Report) -> list[str]:
    """Metric columns: the primary metric first, then the others in first-seen order."""
    names = [report.baseline.primary_metric]
    for model in report.models:
        names += [n for n in model.metrics if n not in names]
    return names


def _format_metric(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.2f}"


def to_markdown(report: Report) -> str:
    """A Markdown section: device line, then one table row per model."""
    metrics = _metric_names(report)
    batch_sizes = report.batch_sizes
    header = ["model", "compression", *metrics, "linear weights (MiB)", "all weights (MiB)"]
    for bs in batch_sizes:
        header += [f"ms @ bs={bs}", f"samples/s @ bs={bs}"]
    rows = []
    for model in report.models:
        row = [model.name, model.compression]
        row += [_format_metric(model.metrics.get(name)) for name in metrics]
        row += [f"{model.linear_weight_bytes / MIB:.2f}", f"{model.total_weight_bytes / MIB:.2f}"]
        for bs in batch_sizes:
            point, speedup = model.latency_at(bs), report.speedup(model, bs)
            if point is None:
                row += ["-", "-"]
                continue
            row += [f"{point.latency_ms:.3f} ({speedup:.2f}x)" if speedup else f"{point.latency_ms:.3f}"]
            row += [f"{point.throughput:.1f}"]
        rows.append(row)
    seq_lens = sorted({p.seq_len for m in report.models for p in m.latency})
    lines = [
        "# Compression report",
        "",
        f"Device: {report.device}; activations: {report.dtype}; sequence length: "
        f"{', '.join(map(str, seq_lens)) or '-'}; latency is the median of timed forward passes after "
        f"warm-up, speed-up (in parentheses) is relative to `{report.baseline.name}`. "
        f"Latency mode: {report.latency_mode}, {LATENCY_MODE_WORDS[report.latency_mode]}.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        *_latency_notes(report),
    ]
    if report.environment:
        lines += ["Environment: " + ", ".join(f"{k} {v}" for k, v in sorted(report.environment.items())), ""]
    return "\n".join(lines)


REFERENCE_NOTE = ("Note: the compressed layers ran the pure-PyTorch reference of their kernels (kernels/reference.py; "
                  "the Triton kernels take CUDA fp16/bf16 inputs only), so their latencies and speed-ups time that "
                  "reference, not the kernels.")


def _latency_notes(report: Report) -> list[str]:
    """The reference note (when the compressed layers ran the reference), one line per model timed in another
    mode than the report's (a failed capture), then a blank line."""
    notes = [REFERENCE_NOTE] if report.reference_kernels else []
    notes += [
        f"Note: `{m.name}` latency timed {m.latency_mode}, not {report.latency_mode}"
        + (f": {m.latency_note}." if m.latency_note else ".")
        for m in report.models
        if m.latency_mode != report.latency_mode
    ]
    return [*notes, ""] if notes else []


def write_markdown(report: Report, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(to_markdown(report))
    return path


def write_json(report: Report, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return path


def read_json(path: str | Path) -> Report:
    return Report.from_dict(json.loads(Path(path).read_text()))


# Label positions tried around each point, nearest first: (dx, dy) in points and the text's alignment.
_LABEL_DIRECTIONS = ((1, 1, "left", "bottom"), (1, -1, "left", "top"), (-1, 1, "right", "bottom"),
                     (-1, -1, "right", "top"), (0, 1, "center", "bottom"), (0, -1, "center", "top"),
                     (1, 0, "left", "center"), (-1, 0, "right", "center"))
_LABEL_CANDIDATES = tuple((d * dx, d * dy, ha, va) for d in (5, 12, 22, 34) for dx, dy, ha, va in _LABEL_DIRECTIONS)
_MARKER_SIZE = 40  # scatter marker area in points^2
_FRAME_GAP = 3  # pixels between a label and the axes' frame
_LABEL_GAP = 2  # pixels each label keeps clear around itself (two labels stay 4 apart)


def _overlap(a, b) -> float:
    """Area (pixels^2) two display boxes share."""
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return width * height if width > 0 and height > 0 else 0.0


def _outside(box, frame) -> float:
    """Area (pixels^2) of ``box`` outside ``frame``."""
    return box.width * box.height - _overlap(box, frame)


def place_labels(axes, labels: list[tuple[str, float, float]]) -> list:
    """Annotate each ``(text, x, y)`` data point, at the first of :data:`_LABEL_CANDIDATES` whose text box
    lies inside the axes (``_FRAME_GAP`` pixels off the frame) and clear of every marker and of the labels
    placed before it (``_LABEL_GAP`` pixels around each); where none is clear, at the one overlapping
    least. Run after the axes' limits and the figure's layout are final (the boxes are measured in
    display pixels). Returns the texts."""
    from matplotlib.transforms import Bbox

    figure = axes.figure
    renderer = figure.canvas.get_renderer()
    frame = axes.get_window_extent(renderer).padded(-_FRAME_GAP)
    radius = (_MARKER_SIZE ** 0.5) / 2 * figure.dpi / 72
    taken = [Bbox.from_bounds(px - radius, py - radius, 2 * radius, 2 * radius)
             for px, py in (axes.transData.transform((x, y)) for _, x, y in labels)]
    texts = []
    for name, x, y in labels:
        best = None
        for dx, dy, ha, va in _LABEL_CANDIDATES:
            text = axes.annotate(name, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va)
            box = text.get_window_extent(renderer)
            cost = _outside(box, frame) + sum(_overlap(box.padded(_LABEL_GAP), other) for other in taken)
            if best is not None and cost >= best[0]:
                text.remove()
                continue
            if best is not None:
                best[1].remove()
            best = (cost, text, box.padded(_LABEL_GAP))
            if cost == 0:
                break
        taken.append(best[2])
        texts.append(best[1])
    return texts


def accuracy_vs_speed_figure(report: Report, batch_size: int | None = None):
    """The figure of :func:`plot_accuracy_vs_speed` (matplotlib, Agg canvas), its labels placed apart and
    inside the axes; margins around the points leave them room."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = report.batch_sizes
    if not sizes:
        raise ValueError("plot_accuracy_vs_speed: the report has no latency points")
    batch_size = max(sizes) if batch_size is None else batch_size
    if batch_size not in sizes:
        raise ValueError(f"batch_size: expected one of the measured sizes {sizes}, got {batch_size}")
    metric = report.baseline.primary_metric
    figure, axes = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    labels = []
    for model in report.models:
        point = model.latency_at(batch_size)
        if point is None or metric not in model.metrics:
            continue
        axes.scatter(point.throughput, model.metrics[metric], s=_MARKER_SIZE)
        labels.append((model.name, point.throughput, model.metrics[metric]))
    direction = "higher is better" if report.baseline.higher_is_better else "lower is better"
    axes.set_xlabel(f"throughput at batch size {batch_size} (samples/s)")
    axes.set_ylabel(f"{metric} ({direction})")
    axes.set_title(f"{metric} vs speed on {report.device} ({report.dtype}, {report.latency_mode})")
    axes.grid(True, alpha=0.3)
    axes.margins(x=0.25, y=0.2)
    figure.tight_layout()
    place_labels(axes, labels)
    return figure


def plot_accuracy_vs_speed(report: Report, path: str | Path, batch_size: int | None = None) -> Path:
    """PNG: throughput at ``batch_size`` (default: the largest measured) vs the primary metric."""
    import matplotlib.pyplot as plt

    figure = accuracy_vs_speed_figure(report, batch_size)
    path = Path(path)
    figure.savefig(path, dpi=figure.dpi)
    plt.close(figure)
    return path


def report_paths(out_dir: str | Path, stem: str = "report") -> dict[str, Path]:
    """The files :func:`write_report` writes: ``{"markdown": <stem>.md, "json": <stem>.json, "plot": <stem>.png}``."""
    return {kind: Path(out_dir) / f"{stem}{suffix}" for kind, suffix in REPORT_SUFFIXES.items()}


def check_report_target(out_dir: str | Path, stem: str = "report", overwrite: bool = False,
                        flag: str = "overwrite=True") -> dict[str, Path]:
    """:func:`report_paths`, or ``FileExistsError`` naming those that exist already when not ``overwrite``
    (``flag``: how the caller's user asks to replace them)."""
    paths = report_paths(out_dir, stem)
    existing = [str(path) for path in paths.values() if os.path.lexists(path)]
    if existing and not overwrite:
        raise FileExistsError(f"{Path(out_dir)}: holds an earlier report ({', '.join(existing)}); pass {flag} "
                              "to replace it, or write elsewhere")
    return paths


def write_report(report: Report, out_dir: str | Path, stem: str = "report") -> dict[str, Path]:
    """Write ``<stem>.md``, ``<stem>.json`` and ``<stem>.png`` into ``out_dir``; return their paths."""
    paths = report_paths(out_dir, stem)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return {
        "markdown": write_markdown(report, paths["markdown"]),
        "json": write_json(report, paths["json"]),
        "plot": plot_accuracy_vs_speed(report, paths["plot"]),
    }
