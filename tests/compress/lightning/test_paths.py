"""Tests for compress/lightning/paths.py: the checkout's root, where the MiniLM model is found."""
from pathlib import Path

from compress.lightning.paths import MINILM_NAME, data_root, repo_root, resolve_model_path


def test_minilm_name_resolves_to_env_then_package(monkeypatch, tmp_path):
    monkeypatch.setenv("MINILM_DIR", str(tmp_path))
    assert resolve_model_path(MINILM_NAME) == str(tmp_path)
    monkeypatch.delenv("MINILM_DIR")
    assert resolve_model_path("some/hub-id") == "some/hub-id"
    packaged = resolve_model_path(MINILM_NAME)
    assert (Path(packaged) / "config.json").is_file()


def test_repo_root_holds_the_package_and_the_recipes(monkeypatch, tmp_path):
    assert (repo_root() / "compress" / "lightning" / "paths.py").is_file()
    assert (repo_root() / "recipes" / "quickstart.yaml").is_file()
    monkeypatch.delenv("COMPRESS_DATA_DIR", raising=False)
    assert data_root() == repo_root().parent / "shared" / "data"
    monkeypatch.setenv("COMPRESS_DATA_DIR", str(tmp_path))
    assert data_root() == tmp_path
