"""scripts/bench/post_training.py on the CPU: a tiny Llama, the MiniLM tokenizer, a few WikiText blocks."""
from __future__ import annotations

import json
import math

import pytest
import transformers

from compress.lightning.paths import data_root
from scripts.bench.post_training import gptq_share, main, variants


def test_variants_pair_round_to_nearest_with_gptq():
    names = list(variants([32, 128]))
    assert names == ["w8a8-rtn", "w8a8-gptq", "w8a16-rtn", "w8a16-gptq", "w4a16-g32-rtn", "w4a16-g32-gptq",
                     "w4a16-g128-rtn", "w4a16-g128-gptq", "w4a16-g128-gptq-natural-order"]


def test_gptq_share_is_the_removed_part_of_the_increase():
    results = {"a-rtn": {"perplexity": 30.0}, "a-gptq": {"perplexity": 25.0}, "b-rtn": {"perplexity": 20.0}}
    assert gptq_share(results, dense=20.0) == {"a": 0.5}  # b has no GPTQ twin


def _tiny_llama(tmp_path, layers: int) -> str:
    """A random Llama with MiniLM's vocabulary, saved under ``tmp_path``; its directory."""
    config = transformers.LlamaConfig(vocab_size=30522, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "tiny")
    return str(tmp_path / "tiny")


@pytest.mark.skipif(not (data_root() / "wikitext-2" / "valid.txt").is_file(), reason="needs WikiText-2")
def test_runs_end_to_end_on_a_tiny_llama(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert main(["--model", _tiny_llama(tmp_path, layers=2), "--tokenizer", "all-MiniLM-L6-v2", "--group-sizes", "32",
                 "--calibration-batches", "2", "--batch-size", "2", "--block-size", "32", "--max-eval-blocks", "4",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["variants"]) == set(variants([32]))
    assert result["calibration_blocks"] == 4 and result["eval_blocks"] == 4
    assert all(math.isfinite(v["perplexity"]) for v in result["variants"].values())
    assert set(result["gptq_share_of_rtn_increase_removed"]) == {"w8a8", "w8a16", "w4a16-g32"}
    assert "w4a16-g32-gptq" in capsys.readouterr().out


@pytest.mark.skipif(not (data_root() / "wikitext-2" / "valid.txt").is_file(), reason="needs WikiText-2")
def test_only_runs_the_named_variants(tmp_path):
    out = tmp_path / "result.json"
    assert main(["--model", _tiny_llama(tmp_path, layers=1), "--tokenizer", "all-MiniLM-L6-v2", "--group-sizes", "32",
                 "--calibration-batches", "1", "--batch-size", "2", "--block-size", "32", "--max-eval-blocks", "2",
                 "--only", "w8a16", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["variants"]) == {"w8a16-rtn", "w8a16-gptq"}
    assert set(result["gptq_share_of_rtn_increase_removed"]) == {"w8a16"}
