"""scripts.bench.block_sqnr: SQNR of block-scaled against per-token / per-channel int8 on outlier channels."""
import json
import math

import pytest
import torch

from scripts.bench import block_sqnr


def test_sqnr_of_known_noise():
    ref = torch.ones(100)
    assert block_sqnr.sqnr_db(ref, ref) == math.inf
    assert block_sqnr.sqnr_db(ref, ref * 1.01) == pytest.approx(40.0)


def test_block_scales_keep_outlier_channels_from_swamping_the_tokens():
    rows = block_sqnr.synthetic(m=8, k=2048, n=128, outlier_channels=4)  # at most 4 of 16 blocks hold outliers
    plain, outliers = rows[0], rows[-1]
    assert plain["outlier_scale"] == 1 and outliers["outlier_scale"] == 100
    assert abs(plain["output_w8a8"] - plain["output_w8a8_block"]) < 3  # Gaussian: both near-lossless 8 bits
    assert plain["act_per_token"] > 35 and plain["act_1x128"] > 35
    assert outliers["act_1x128"] > outliers["act_per_token"] + 5  # only the outliers' own blocks lose
    assert outliers["output_w8a8_block"] > outliers["output_w8a8"] + 5


def test_main_writes_json_without_minilm(tmp_path):
    out = tmp_path / "sqnr.json"
    report = block_sqnr.main(["--m", "4", "--k", "256", "--n", "128", "--outlier-channels", "2", "--sentences", "0",
                              "--out", str(out)])
    assert json.loads(out.read_text()) == report and "minilm" not in report
    assert [r["outlier_scale"] for r in report["synthetic"]] == list(block_sqnr.OUTLIER_SCALES)
    with pytest.raises(SystemExit):
        block_sqnr.main(["--outlier-channels", "5000", "--k", "256", "--sentences", "0"])


def test_summary_is_min_and_mean_over_layers():
    layers = {"a": {"x": 30.0}, "b": {"x": 40.0}}
    assert block_sqnr.summarise(layers) == {"x": {"min": 30.0, "mean": 35.0}}
