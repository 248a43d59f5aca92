"""scripts.examples.plain_loop on a few steps: the export agrees with the trained model, and a run
resumed from its checkpoint ends with the uninterrupted run's model."""
import torch

from scripts.examples import plain_loop


def test_the_example_trains_and_exports_the_same_function(tmp_path, capsys):
    result = plain_loop.main(["--steps", "20", "--export-dir", str(tmp_path / "export")])
    assert result["exported_layers"] == {"BSRW8A8Linear": 12}  # 2 layers x (q, k, v, attention out, MLP in, out)
    assert result["exported_accuracy"] == result["trained_accuracy"]
    assert result["max_logit_difference"] < 5e-2  # W8A8 rounding of the reference kernels vs fake quantization
    out = capsys.readouterr().out
    assert "held-out digits" in out
    assert (tmp_path / "export" / "manifest.json").is_file()
    progress = [line.split(":")[0] for line in out.splitlines() if line.startswith("step ")]
    assert progress == ["step 10/20", "step 20/20"]  # every --log-every steps (10 by default)


def test_progress_names_each_phase_of_the_schedule(capsys):
    """20 steps (build's fractions): steps 0-3 dense, 4-11 pruning, 12-14 pruned, 15-19 W8A8 QAT; a line after
    every 2 steps names the phase of the last one (1, 3, ..., 19)."""
    plain_loop.train(steps=20, log_every=2)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in lines] == [f"step {n}/20" for n in range(2, 21, 2)]
    assert [line.split("(")[1].split(")")[0] for line in lines] == (
        ["dense"] * 2 + ["pruning"] * 4 + ["pruned"] + ["W8A8 QAT"] * 3)
    assert all(float(line.split(": loss ")[1].split()[0]) > 0 for line in lines)


def test_a_resumed_run_ends_like_the_uninterrupted_one(tmp_path):
    checkpoint = tmp_path / "run.pt"
    full, _ = plain_loop.train(steps=20, checkpoint=checkpoint, save_every=15)
    assert torch.load(checkpoint, weights_only=True)["schedule"]["global_step"] == 15
    resumed, schedule = plain_loop.train(steps=20, checkpoint=checkpoint, resume=True)
    assert schedule.global_step == 20 and schedule.finished
    for name, tensor in full.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], tensor), name
