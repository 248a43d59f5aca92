"""CPU checks of scripts/sst2_variants.sh that start no training: bad variant specs are refused
before any run begins, and each variant's recipe copy points its Export at the variant's own run dir."""
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args, cwd=REPO):
    return subprocess.run(["bash", str(REPO / "scripts" / "sst2_variants.sh"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


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
    line = next(l for l in script.splitlines() if l.strip().startswith("sed -E"))
    command = line.strip().split(">")[0].replace('"$recipe"', "recipes/minilm-sst2-sparse50.yaml").replace("$name", "v1")
    copied = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "dirpath: runs/minilm-sst2-v1/compressed" in copied
    assert "minilm-sst2-sparse50/" not in copied
