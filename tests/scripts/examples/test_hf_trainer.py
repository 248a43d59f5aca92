"""scripts.examples.hf_trainer on a few steps: the Trainer's run exports the function it trained, and
writes the schedule's state into every checkpoint."""
import pytest
import torch

pytest.importorskip("accelerate", reason="the transformers Trainer needs accelerate")
from scripts.examples import hf_trainer  # noqa: E402


def test_the_example_trains_with_the_trainer_and_exports_the_same_function(tmp_path):
    result = hf_trainer.main(["--output-dir", str(tmp_path), "--steps", "12", "--save-steps", "6"])
    assert result["exported_layers"] == {"BSRW8A8Linear": 12}
    assert result["exported_accuracy"] == result["trained_accuracy"] and result["max_logit_difference"] < 5e-2
    state = torch.load(tmp_path / "checkpoint-6" / "compression_schedule.pt", weights_only=True)
    assert state["global_step"] == 6 and state["pruning"]["last_pruned_step"] is not None
