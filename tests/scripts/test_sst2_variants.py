"""CPU checks of scripts/sst2_variants.sh that start no training: bad variant specs are refused
before any run begins, and each variant's recipe copy points its Export at the variant's own run dir."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAIL_FAST = {"SWEEP_RUN_ARGS": "--no-such-flag", "SWEEP_EVAL_ARGS": "--no-such-flag"}  # runs stop at parsing


def run(*args, cwd=REPO):
    """The script with this interpreter's environment first on PATH (its ``python`` is the project's)."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return subprocess.run(["bash", str(REPO / "scripts" / "sst2_variants.sh"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env={**os.environ, **FAIL_FAST, "PATH": path})


def test_no_variants_is_refused(tmp_path):
    result = run(str(tmp_path / "out"), "00:00:01:00")
    assert result.returncode == 2 and "no variants given" in result.stderr


def test_missing_recipe_is_refused_before_training(tmp_path):
    result = run(str(tmp_path / "out"), "00:00:01:00", "x|recipes/no-such-recipe.yaml|")
    assert result.returncode == 2 and "no recipe file recipes/no-such-recipe.yaml" in result.stderr
    assert not (tmp_path / "out" / "train-x.log").exists()


def test_recipe_copy_rewrites_run_paths(tmp_path):
    # the sed line the script uses, applied to the shipped sparse recipe
    script = (REPO / "scripts" / "sst2_variants.sh").read_text()
    line = next(text for text in script.splitlines() if text.strip().startswith("sed -E"))
    command = line.strip().split(">")[0]
    command = command.replace('"$recipe"', "recipes/minilm-sst2-sparse50.yaml").replace("$name", "v1")
    copied = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "dirpath: runs/minilm-sst2-v1/compressed" in copied
    assert "minilm-sst2-sparse50/" not in copied


def test_a_bad_edit_in_any_spec_is_refused_before_any_run_starts(tmp_path):
    out = tmp_path / "out"
    result = run(str(out), "00:00:01:00", "ok|recipes/minilm-sst2-sparse50.yaml|",
                 "bad|recipes/minilm-sst2-sparse50.yaml||NoSuchCallback.x=1")
    assert result.returncode == 2 and "variant bad: bad edits" in result.stderr
    assert not (out / "train-ok.log").exists()  # the first, valid variant never started


def test_edits_land_in_the_recipe_copy(tmp_path):
    import yaml

    out = tmp_path / "out"
    # the runs and the evaluation fail at once on a bad flag (FAIL_FAST); the copy is written before that
    recipe = REPO / "recipes" / "minilm-sst2-sparse50.yaml"
    run(str(out), "00:00:01:00", f"g|{recipe}||BlockPruning.allocation=global")
    copied = yaml.safe_load((out / "recipes" / "g.yaml").read_text())
    pruning = next(c for c in copied["trainer"]["callbacks"] if c["class_path"].endswith("BlockPruning"))
    assert pruning["init_args"]["allocation"] == "global"
    dirpaths = [c.get("init_args", {}).get("dirpath") for c in copied["trainer"]["callbacks"]]
    assert "runs/minilm-sst2-g/compressed" in dirpaths


def test_running_outside_the_repository_root_is_refused(tmp_path):
    result = run(str(tmp_path / "out"), "00:00:01:00", "x|recipes/minilm-sst2-dense.yaml|", cwd=tmp_path)
    assert result.returncode == 2 and "run it from the repository root" in result.stderr
    assert not (tmp_path / "out").exists()
