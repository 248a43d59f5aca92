"""scripts.examples.plain_loop on a few steps: the export agrees with the trained model, and a run
resumed from its checkpoint ends with the uninterrupted run's model."""
import torch

from scripts.examples import plain_loop


def test_the_example_trains_and_exports_the_same_function(tmp_path, capsys):
    result = plain_loop.main(["--steps", "20", "--export-dir", str(tmp_path / "export")])
    assert result["exported_layers"] == {"BSRW8A8Linear": 12}  # 2 layers x (q, k, v, attention out, MLP in, out)
    assert result["exported_accuracy"] == result["trained_accuracy"]
    assert result["max_logit_difference"] < 5e-2  # W8A8 rounding of the reference kernels vs fake quantization
    assert "held-out digits" in capsys.readouterr().out
    assert (tmp_path / "export" / "manifest.json").is_file()


def test_a_resumed_run_ends_like_the_uninterrupted_one(tmp_path):
    checkpoint = tmp_path / "run.pt"
    full, _ = plain_loop.train(steps=20, checkpoint=checkpoint, save_every=15)
    assert torch.load(checkpoint, weights_only=True)["schedule"]["global_step"] == 15
    resumed, schedule = plain_loop.train(steps=20, checkpoint=checkpoint, resume=True)
    assert schedule.global_step == 20 and schedule.finished
    for name, tensor in full.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], tensor), name
