"""scripts/bench/block_pruning.py on the CPU: a tiny Llama, the MiniLM tokenizer, a few WikiText blocks."""
from __future__ import annotations

import json
import math

import pytest

from compress.lightning.paths import data_root
from scripts.bench.block_pruning import main, our_variants, peer_recipe
from tests.scripts.bench.test_post_training import _tiny_llama


def test_variants_sweep_obs_and_compare_scores_and_quantization_at_half():
    names = list(our_variants([0.25, 0.5]))
    assert names == ["blocks-25-obs", "blocks-50-obs", "blocks-50-obs-w4a16-g32", "blocks-50-obs-w8a8",
                     "blocks-50-magnitude", "blocks-50-activation", "blocks-50-obs-tiles4",
                     "blocks-50-activation-tiles4"]


def test_an_unknown_peer_variant_is_refused():
    pytest.importorskip("llmcompressor")
    with pytest.raises(ValueError, match="expected one of"):
        peer_recipe("magnitude-2of4")


@pytest.mark.skipif(not (data_root() / "wikitext-2" / "valid.txt").is_file(), reason="needs WikiText-2")
def test_runs_end_to_end_on_a_tiny_llama(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert main(["--model", _tiny_llama(tmp_path, layers=1), "--tokenizer", "all-MiniLM-L6-v2", "--sparsities", "0.5",
                 "--calibration-batches", "2", "--batch-size", "2", "--block-size", "32", "--max-eval-blocks", "2",
                 "--only", "blocks-50-obs,blocks-50-magnitude", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["variants"]) == {"blocks-50-obs", "blocks-50-magnitude"}
    assert all(math.isfinite(v["perplexity"]) for v in result["variants"].values())
    assert "blocks-50-obs" in capsys.readouterr().out
