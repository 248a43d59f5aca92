"""scripts/bench/sweep_points.py: a joint report replaces the dense entry and the points it names; a point
it lacks keeps its figures with its own run's dense latencies; bad input is refused by name."""
import json

import pytest

from compress.eval.report import LatencyPoint, ModelResult, Report, write_json
from scripts.bench.llm_sections import sweep_section
from scripts.bench.sweep_points import fold, main


def _model(name, perplexity, ms):
    return ModelResult(name, {"perplexity": perplexity, "loss": 1.0}, "perplexity", False,
                       [LatencyPoint(1, 1024, ms), LatencyPoint(8, 1024, 4 * ms)], 1000, 2000,
                       source=f"runs/{name}", compression="BSRLinear x2")


def _sweep():
    return {"commit": "old", "description": "A sweep.", "environment": {"gpu": "H200"},
            "dense": {"perplexity": 16.0, "latency_ms": {"1": 5.0, "8": 20.0}, "linear_weight_bytes": 4000},
            "points": [{"name": "blocks-25", "recipe": "r25", "perplexity": 22.0},
                       {"name": "blocks-50-w4a16", "recipe": "rw4", "perplexity": 30.0,
                        "latency_ms": {"1": 4.0, "8": 16.0}}]}


@pytest.fixture
def report(tmp_path):
    joint = Report([_model("dense", 16.5, 4.0), _model("blocks-25", 22.5, 2.0)], "NVIDIA H200", "float16",
                   {"torch": "2.11", "gpu": "NVIDIA H200"}, "cuda_graph")
    return write_json(joint, tmp_path / "report.json")


def test_the_report_replaces_dense_and_its_points_and_the_rest_keep_their_own_dense(report):
    sweep = fold(_sweep(), report, "new", "measured together")
    assert sweep["dense"] == {"perplexity": 16.5, "latency_ms": {"1": 4.0, "8": 16.0}, "linear_weight_bytes": 1000}
    measured, kept = sweep["points"]
    assert measured["perplexity"] == 22.5 and measured["latency_ms"] == {"1": 2.0, "8": 8.0}
    assert (measured["measured_by"], measured["commit"], measured["compression"]) == (
        "compress evaluate", "new", "BSRLinear x2")
    assert kept["perplexity"] == 30.0 and kept["dense_latency_ms"] == {"1": 5.0, "8": 20.0}
    assert kept["commit"] == "old"
    assert (sweep["commit"], sweep["note"], sweep["latency_mode"]) == ("new", "measured together", "cuda_graph")
    text = "\n".join(sweep_section("s.json", sweep))
    assert "| blocks-25 | r25 | 22.50 | +36.4% | 2.000 (2.00x) | 8.000 (2.00x) | 0.0 |" in text
    assert "| blocks-50-w4a16 | rw4 | 30.00 | +81.8% | 4.000 (1.25x) | 16.000 (1.25x) | - |" in text


def test_a_model_that_is_no_point_and_a_report_without_dense_first_are_refused(tmp_path):
    other = write_json(Report([_model("dense", 16.0, 4.0), _model("blocks-90", 90.0, 1.0)], "GPU", "float16", {},
                              "cuda_graph"), tmp_path / "other.json")
    with pytest.raises(ValueError, match=r"models \['blocks-90'\] are not points of the sweep"):
        fold(_sweep(), other, "c", "")
    swapped = write_json(Report([_model("blocks-25", 22.0, 2.0), _model("dense", 16.0, 4.0)], "GPU", "float16", {},
                                "cuda_graph"), tmp_path / "swapped.json")
    with pytest.raises(ValueError, match=r"expected the dense model first \(named 'dense'\), got 'blocks-25'"):
        fold(_sweep(), swapped, "c", "")


def test_command_line_rewrites_the_sweep_in_place(report, tmp_path):
    results = tmp_path / "smollm2-h200.json"
    results.write_text(json.dumps({"sweep": _sweep(), "pruning": {"runs": []}}))
    assert main(["--report", str(report), "--commit", "new", "--results", str(results)]) == 0
    data = json.loads(results.read_text())
    assert data["pruning"] == {"runs": []} and data["sweep"]["points"][0]["perplexity"] == 22.5
    results.write_text(json.dumps({"pruning": {}}))
    with pytest.raises(SystemExit):
        main(["--report", str(report), "--commit", "new", "--results", str(results)])


def test_a_new_point_is_added_from_the_report(tmp_path):
    joint = write_json(Report([_model("dense", 16.0, 4.0), _model("blocks-50-tiles4", 31.0, 2.0)], "GPU", "float16",
                              {}, "cuda_graph"), tmp_path / "tiles.json")
    sweep = fold(_sweep(), joint, "c", "", {"blocks-50-tiles4": "r50 with tile_rows 4"})
    assert sweep["points"][-1]["recipe"] == "r50 with tile_rows 4" and sweep["points"][-1]["perplexity"] == 31.0
    with pytest.raises(ValueError, match="--new-point blocks-25: the sweep already has that point"):
        fold(_sweep(), joint, "c", "", {"blocks-25": "r"})


def test_the_plot_is_copied_beside_the_pages_and_shown_with_the_sweep(report, tmp_path):
    results = tmp_path / "smollm2-h200.json"
    results.write_text(json.dumps({"sweep": _sweep()}))
    (tmp_path / "report.png").write_bytes(b"png bytes")
    pages = tmp_path / "pages"
    pages.mkdir()
    main(["--report", str(report), "--commit", "new", "--results", str(results), "--plot",
          str(tmp_path / "report.png"), "--plot-dir", str(pages)])
    sweep = json.loads(results.read_text())["sweep"]
    assert sweep["plot"] == (pages / "smollm2-h200-sweep.png").as_posix()
    assert (pages / "smollm2-h200-sweep.png").read_bytes() == b"png bytes"
    assert f"](../../{sweep['plot']})" in "\n".join(sweep_section("s.json", sweep))
    with pytest.raises(ValueError, match="expected the report's .png plot"):
        main(["--report", str(report), "--commit", "new", "--results", str(results), "--plot",
              str(tmp_path / "missing.png"), "--plot-dir", str(pages)])
