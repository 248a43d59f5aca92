"""Report writers (Markdown, JSON, PNG) on reports fabricated here, with assertions on their content."""
import json
import struct

import pytest

from compress.eval.report import (
    LATENCY_MODE_WORDS,
    REFERENCE_NOTE,
    LatencyPoint,
    ModelResult,
    Report,
    check_report_target,
    plot_accuracy_vs_speed,
    read_json,
    to_markdown,
    write_report,
)


def _model(name, accuracy, latencies, linear_bytes, compression="dense"):
    points = [LatencyPoint(bs, 64, ms) for bs, ms in latencies.items()]
    return ModelResult(
        name=name,
        metrics={"accuracy": accuracy, "f1": accuracy - 0.01},
        primary_metric="accuracy",
        higher_is_better=True,
        latency=points,
        linear_weight_bytes=linear_bytes,
        total_weight_bytes=linear_bytes + 1024 * 1024,
        source=f"/models/{name}",
        compression=compression,
    )


@pytest.fixture
def report():
    dense = _model("dense", 0.91, {1: 2.0, 8: 4.0}, 4 * 1024 * 1024)
    w8a8 = _model("w8a8", 0.905, {1: 1.0, 8: 2.5}, 1024 * 1024, compression="W8A8Linear x36")
    return Report([dense, w8a8], device="Test GPU", dtype="float16", environment={"torch": "9.9"})


def test_throughput_is_samples_per_second():
    point = LatencyPoint(batch_size=8, seq_len=64, latency_ms=4.0)
    assert point.throughput == pytest.approx(8 / 0.004)


def test_speedup_is_relative_to_the_first_model(report):
    w8a8 = report.models[1]
    assert report.speedup(w8a8, 1) == pytest.approx(2.0)
    assert report.speedup(w8a8, 8) == pytest.approx(4.0 / 2.5)
    assert report.speedup(w8a8, 32) is None


def test_markdown_table_has_one_row_per_model_with_figures(report):
    text = to_markdown(report)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 3  # header + 2 models
    header, dense_row, w8a8_row = rows
    assert "accuracy" in header and "ms @ bs=8" in header and "samples/s @ bs=1" in header
    assert dense_row.startswith("| dense | dense | 0.9100")
    assert "4.00" in dense_row  # linear weights in MiB
    assert "1.000 (2.00x)" in w8a8_row  # latency at bs=1 and its speed-up
    assert "3200.0" in w8a8_row  # throughput at bs=8: 8 / 2.5 ms
    assert "Test GPU" in text and "float16" in text


def _timed_in(report, mode):
    report.latency_mode = mode
    for model in report.models:
        model.latency_mode = mode
    return report


def test_markdown_header_states_the_latency_mode(report):
    _timed_in(report, "cuda_graph")
    text = to_markdown(report)
    header_line = next(line for line in text.splitlines() if line.startswith("Device:"))
    assert "Latency mode: cuda_graph" in header_line and LATENCY_MODE_WORDS["cuda_graph"] in header_line
    assert "Note:" not in text


def test_markdown_notes_a_model_timed_eager_after_a_failed_capture(report):
    _timed_in(report, "cuda_graph")
    report.models[1].latency_mode = "eager"
    report.models[1].latency_note = "cuda_graph failed (RuntimeError: capture broke); timed eager"
    notes = [line for line in to_markdown(report).splitlines() if line.startswith("Note:")]
    assert len(notes) == 1
    assert "`w8a8`" in notes[0] and "timed eager, not cuda_graph" in notes[0] and "capture broke" in notes[0]


@pytest.mark.parametrize("reference", [True, False])
def test_markdown_says_when_latencies_time_the_reference_and_json_keeps_it(report, tmp_path, reference):
    report.reference_kernels = reference
    notes = [line for line in to_markdown(report).splitlines() if line.startswith("Note:")]
    assert notes == ([REFERENCE_NOTE] if reference else [])
    paths = write_report(report, tmp_path)
    assert json.loads(paths["json"].read_text())["reference_kernels"] is reference
    assert read_json(paths["json"]).reference_kernels is reference


def test_check_report_target_refuses_an_earlier_report_unless_overwriting(tmp_path):
    expected = {kind: tmp_path / f"r{suffix}" for kind, suffix in (("markdown", ".md"), ("json", ".json"),
                                                                    ("plot", ".png"))}
    assert check_report_target(tmp_path, "r") == expected  # nothing there yet
    (tmp_path / "r.png").write_bytes(b"")
    (tmp_path / "other.md").write_text("not a report of this stem")
    with pytest.raises(FileExistsError, match=r"holds an earlier report \(.*r\.png\); pass --overwrite") as error:
        check_report_target(tmp_path, "r", flag="--overwrite")
    assert "other.md" not in str(error.value)
    assert check_report_target(tmp_path, "r", overwrite=True) == expected


def test_report_rejects_an_unknown_latency_mode(report):
    with pytest.raises(ValueError, match="latency_mode") as error:
        Report(report.models, "cpu", "float32", latency_mode="graphs")
    assert all(mode in str(error.value) for mode in LATENCY_MODE_WORDS)


def test_json_without_latency_mode_reads_as_eager(report, tmp_path):
    data = report.to_dict()
    del data["latency_mode"]
    del data["reference_kernels"]
    for model in data["models"]:
        del model["latency_mode"], model["latency_note"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    again = read_json(path)
    assert again.latency_mode == "eager" and all(m.latency_mode == "eager" for m in again.models)
    assert again.reference_kernels is False


def test_json_round_trip(report, tmp_path):
    paths = write_report(report, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["baseline"] == "dense"
    assert data["models"][1]["latency"][0]["throughput"] == pytest.approx(1000.0)
    again = read_json(paths["json"])
    assert again.to_dict() == report.to_dict()


def test_json_round_trip_keeps_latency_modes_and_notes(report, tmp_path):
    _timed_in(report, "compile").models[1].latency_mode = "eager"
    report.models[1].latency_note = "compile failed (BackendCompilerFailed: x); timed eager"
    paths = write_report(report, tmp_path)
    assert json.loads(paths["json"].read_text())["latency_mode"] == "compile"
    again = read_json(paths["json"])
    assert again.latency_mode == "compile" and again.models[1].latency_note == report.models[1].latency_note


def test_plot_is_a_png_of_the_plotted_size(report, tmp_path):
    path = plot_accuracy_vs_speed(report, tmp_path / "plot.png", batch_size=8)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 300 and height > 200


def test_plot_rejects_an_unmeasured_batch_size(report, tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        plot_accuracy_vs_speed(report, tmp_path / "plot.png", batch_size=3)


def test_report_rejects_mixed_primary_metrics(report):
    perplexity = _model("lm", 10.0, {1: 1.0}, 10)
    perplexity.primary_metric = "perplexity"
    with pytest.raises(ValueError, match="primary metric"):
        Report([report.models[0], perplexity], "cpu", "float32")
    with pytest.raises(ValueError, match="at least one"):
        Report([], "cpu", "float32")


def test_read_json_refuses_another_format_version(report, tmp_path):
    path = tmp_path / "r.json"
    data = report.to_dict()
    data["format_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="format_version"):
        read_json(path)


def _crowded_report():
    """Seven models, two pairs almost on top of each other and long names at both ends of the x range."""
    spots = [("float weights of this run", 0.847, 1376.0), ("compressed (quickstart)", 0.847, 446.0),
             ("w8a8-qat", 0.846, 1370.0), ("w4a16-qat", 0.845, 1360.0), ("sparse50", 0.80, 700.0),
             ("sparse50-w8a8", 0.801, 705.0), ("w4a16-gptq with a longer name", 0.90, 450.0)]
    models = [_model(name, accuracy, {8: 8 / throughput * 1000}, 1024) for name, accuracy, throughput in spots]
    return Report(models, device="cpu (2 threads)", dtype="float32")


def test_plot_labels_lie_inside_the_axes_and_apart():
    import matplotlib.pyplot as plt

    from compress.eval.report import accuracy_vs_speed_figure

    report = _crowded_report()
    figure = accuracy_vs_speed_figure(report, batch_size=8)
    try:
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        axes = figure.axes[0]
        boxes = {text.get_text(): text.get_window_extent(renderer) for text in axes.texts}
        assert sorted(boxes) == sorted(m.name for m in report.models)
        frame, page = axes.get_window_extent(renderer), figure.bbox
        for name, box in boxes.items():
            assert frame.x0 < box.x0 and box.x1 < frame.x1 and frame.y0 < box.y0 and box.y1 < frame.y1, name
            assert page.contains(box.x0, box.y0) and page.contains(box.x1, box.y1), name
        names = list(boxes)
        for i, first in enumerate(names):
            for second in names[i + 1:]:
                assert not boxes[first].overlaps(boxes[second]), (first, second)
    finally:
        plt.close(figure)
