"""Read a peft LoRA adapter folder: `adapter_config.json` plus `adapter_model.safetensors`.

peft stores, for each adapted linear layer of a Llama, `...layers.<i>.<self_attn|mlp>.<proj>.
lora_A.weight` (rank x in) and `lora_B.weight` (out x rank); the layer computes
`W x + scaling * B (A x)` with scaling = lora_alpha / r (lora_alpha / sqrt(r) under rsLoRA).
`read_adapter` returns each module's A and its B with the scaling folded in (float32), keyed by
(layer index, projection name). Anything this engine would not compute exactly as peft does
(bias training, DoRA, extra trained modules, adapted embeddings or LM head, per-module alpha)
is refused with an error that names it, never ignored.
"""

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from shared.errors import InvalidRequestError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The projections an adapter may target, as peft (and HF) name them.
SUPPORTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(" + "|".join(SUPPORTED_MODULES) + r")\.lora_([AB])\.weight$")
FIELD = "lora_request.lora_path"

ModuleKey = tuple[int, str]  # (layer index, projection name)


@dataclass
class AdapterInfo:
    """What admission needs to know: the adapter is readable and fits the engine's limits."""

    rank: int
    # Changes whenever the adapter's files change: part of every block hash of its requests.
    content_key: str
    # (layer, projection) -> (in features, out features) of each adapted module.
    module_dims: dict[ModuleKey, tuple[int, int]]


@dataclass
class AdapterWeights:
    info: AdapterInfo
    # (layer, projection) -> (A: rank x in, scaled B: out x rank), float32.
    modules: dict[ModuleKey, tuple[torch.Tensor, torch.Tensor]]


def inspect_adapter(path: str) -> AdapterInfo:
    """Check the folder's config and tensor names and shapes (no weights read)."""
    folder = Path(path)
    _read_config(folder)  # refuses what peft computes differently
    shapes = _tensor_shapes(folder)
    pairs = _pair_modules(shapes)
    ranks = {key: shapes[a_name][0] for key, (a_name, _) in pairs.items()}
    if not ranks:
        raise InvalidRequestError(FIELD, f"{folder} adapts none of {SUPPORTED_MODULES}")
    for key, (a_name, b_name) in pairs.items():
        if shapes[b_name][1] != ranks[key]:
            raise InvalidRequestError(FIELD, f"{b_name} has shape {shapes[b_name]}, expected rank {ranks[key]}")
    dims = {key: (shapes[a_name][1], shapes[b_name][0]) for key, (a_name, b_name) in pairs.items()}
    return AdapterInfo(rank=max(ranks.values()), content_key=_content_key(folder), module_dims=dims)


def read_adapter(path: str) -> AdapterWeights:
    """The adapter's weights, each module's B scaled as peft scales it."""
    folder = Path(path)
    info = inspect_adapter(path)
    config = _read_config(folder)
    modules = {}
    with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as tensors:
        for key, (a_name, b_name) in _pair_modules({name: () for name in tensors.keys()}).items():
            lora_a = tensors.get_tensor(a_name).float()
            lora_b = tensors.get_tensor(b_name).float()
            modules[key] = (lora_a, lora_b * _scaling(config, lora_a.shape[0]))
    return AdapterWeights(info, modules)


def _read_config(folder: Path) -> dict:
    if not folder.is_dir():
        raise InvalidRequestError(FIELD, f"{str(folder)!r} is not a folder")
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise InvalidRequestError(FIELD, f"{folder} has no {CONFIG_FILE}") from None
    except (OSError, ValueError) as error:
        raise InvalidRequestError(FIELD, f"{folder / CONFIG_FILE} is not readable JSON: {error}") from None
    _check_config(folder, config)
    return config


# peft options under which an adapter computes more than `W x + scaling * B (A x)` on the
# projections (or trains weights this engine never reads): each refused, naming the option.
# DoRA rescales every output column; QA-LoRA pools the input before A; aLoRA adapts only the
# tokens after its invocation tokens; Arrow, BD-LoRA, VeLoRA, MonteCLoRA and KaSA are other
# variants of the layer; layer_replication repeats layers; the rest add trained weights.
_REFUSED_OPTIONS = ("use_dora", "use_qalora", "alora_invocation_tokens", "arrow_config", "use_bdlora",
                    "velora_config", "monteclora_config", "kasa_config", "layer_replication", "lora_bias",
                    "modules_to_save", "trainable_token_indices", "target_parameters", "alpha_pattern",
                    "fan_in_fan_out")


def _check_config(folder: Path, config: dict) -> None:
    refusals = {"peft_type": config.get("peft_type", "LORA") != "LORA", "bias": config.get("bias", "none") != "none",
                **{name: bool(config.get(name)) for name in _REFUSED_OPTIONS}}
    for name, refused in refusals.items():
        if refused:
            raise InvalidRequestError(FIELD, f"{folder}: adapters with {name}={config.get(name)!r} are not supported")
    if not isinstance(config.get("lora_alpha", 8), (int, float)):
        raise InvalidRequestError(FIELD, f"{folder}: lora_alpha must be a number")
    _check_target_modules(folder, config.get("target_modules"))


def _check_target_modules(folder: Path, target_modules) -> None:
    """A list of module names must name only the projections (a regex string is checked by
    the tensors it adapted, in _pair_modules)."""
    if not isinstance(target_modules, list):
        return
    unsupported = sorted(str(name) for name in target_modules if str(name).rpartition(".")[2] not in SUPPORTED_MODULES)
    if unsupported:
        raise InvalidRequestError(FIELD, f"{folder}: target_modules {unsupported} are not projections this engine "
                                         f"can adapt (supported: {', '.join(SUPPORTED_MODULES)})")


def _tensor_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    try:
        with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as tensors:
            return {name: tuple(tensors.get_slice(name).get_shape()) for name in tensors.keys()}
    except FileNotFoundError:
        raise InvalidRequestError(FIELD, f"{folder} has no {WEIGHTS_FILE}") from None
    except Exception as error:  # a corrupt file: safetensors raises its own error types
        raise InvalidRequestError(FIELD, f"{folder / WEIGHTS_FILE} is not a safetensors file: {error}") from None


def _pair_modules(names) -> dict[ModuleKey, tuple[str, str]]:
    """(layer, projection) -> (A tensor name, B tensor name); any other tensor is refused."""
    found: dict[ModuleKey, dict[str, str]] = {}
    for name in names:
        match = _KEY.search(name)
        if match is None:
            raise InvalidRequestError(FIELD, f"tensor {name!r} adapts a module this engine cannot adapt (target_modules "
                                             f"supported: {', '.join(SUPPORTED_MODULES)})")
        layer, module, kind = int(match.group(1)), match.group(2), match.group(3)
        found.setdefault((layer, module), {})[kind] = name
    for key, kinds in found.items():
        if set(kinds) != {"A", "B"}:
            raise InvalidRequestError(FIELD, f"layer {key[0]} {key[1]} has lora_{''.join(kinds)} without its pair")
    return {key: (kinds["A"], kinds["B"]) for key, kinds in found.items()}


def _scaling(config: dict, rank: int) -> float:
    alpha = float(config.get("lora_alpha", 8))
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def _content_key(folder: Path) -> str:
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()[:16]
