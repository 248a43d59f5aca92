"""scripts/bench/moe_section.py: the MoE page's section from a fixture report (the full page: test_pages.py)."""
import pytest

from scripts.bench.moe_section import error_text, moe_section
from tests.scripts.bench.test_pages import moe_report


def test_a_model_without_records_is_left_out_and_missing_cells_are_dashes():
    report = moe_report("GPU X")
    report["config"]["models"]["other"] = {"hidden": 8, "intermediate": 8, "experts": 2, "top_k": 1}
    report["results"] = [r for r in report["results"] if not (r["variant"] == "w4a16-loop" and r["tokens"] == 8)]
    text = "\n".join(moe_section("moe-x.json", report))
    assert "### other" not in text and "### layer" in text
    assert "| w4a16-loop | 800.0 (0.50x) | - |" in text


def test_errors_take_the_largest_present_value():
    assert error_text([None, 2e-3, 5e-2]) == "5.0e-02" and error_text([None]) == "-"


@pytest.mark.parametrize("key", ["environment", "config", "results", "targets"])
def test_a_missing_entry_is_named(key):
    report = moe_report("GPU X")
    del report[key]
    with pytest.raises(ValueError, match=f"moe-x.json: expected a '{key}' entry"):
        moe_section("moe-x.json", report)


def test_the_experts_share_is_shown_where_the_run_timed_it():
    report = moe_report("GPU X")
    report["results"][4].update(experts_ms=0.08, experts_share=0.8)
    text = "\n".join(moe_section("moe-x.json", report))
    assert "| w4a16-grouped | 80.0 (80%) | - |" in text
    del report["results"][4]["experts_ms"]
    assert "The experts alone" not in "\n".join(moe_section("moe-x.json", report))
