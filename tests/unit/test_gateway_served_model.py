"""The gateway starts from a model folder holding only config.json and the tokenizer."""

import json
import os
import subprocess
import sys

from services.gateway.served_model import load_served_model
from tests.unit.conftest import TINY_LLAMA
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture


def weightless_folder(tmp_path, tokenizer, tokenizer_class: str | None = None):
    """A model folder with config.json and the tokenizer only (no weights)."""
    folder = tmp_path / "my-model"
    tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({
        **TINY_LLAMA, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152}))
    if tokenizer_class is not None:
        config_path = folder / "tokenizer_config.json"
        declared = {**json.loads(config_path.read_text()), "tokenizer_class": tokenizer_class}
        config_path.write_text(json.dumps(declared))
    return folder


def test_weightless_folder_is_enough(tmp_path, smollm2_tokenizer):  # noqa: F811
    folder = weightless_folder(tmp_path, smollm2_tokenizer)
    model = load_served_model(str(folder), None, max_model_len=100)
    assert (model.name, model.model_key) == ("my-model", "my-model")
    assert (model.vocab_size, model.max_model_len) == (49152, 100)  # min(config's 128, 100)
    assert model.tokenizer.encode("Hello", add_special_tokens=False) == \
        smollm2_tokenizer.encode("Hello", add_special_tokens=False)
    assert model.accepts("") and model.accepts("my-model") and not model.accepts("other")
    renamed = load_served_model(str(folder), "public-name")
    assert (renamed.name, renamed.model_key, renamed.max_model_len) == ("public-name", "my-model", 128)
    assert renamed.accepts("my-model")


def test_the_gateway_reads_a_generic_fast_tokenizer_without_importing_torch(tmp_path, smollm2_tokenizer):  # noqa: F811
    """AutoTokenizer's import chain imports torch (240 MiB of the gateway's memory); a folder whose
    tokenizer is the generic fast one is loaded as that class directly, and encodes the same."""
    folder = weightless_folder(tmp_path, smollm2_tokenizer)
    script = ("import sys; from services.gateway.served_model import load_served_model; "
              f"model = load_served_model({str(folder)!r}, None); "
              "print(type(model.tokenizer).__name__, 'torch' in sys.modules, "
              "model.tokenizer.encode('<|im_start|>user Hi ünï 漢字<|im_end|>', add_special_tokens=False))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}).stdout.split(" ", 2)
    assert out[:2] == ["TokenizersBackend", "False"]
    assert json.loads(out[2]) == smollm2_tokenizer.encode("<|im_start|>user Hi ünï 漢字<|im_end|>",
                                                           add_special_tokens=False)


def test_a_tokenizer_of_another_class_still_goes_through_autotokenizer(tmp_path, smollm2_tokenizer):  # noqa: F811
    folder = weightless_folder(tmp_path, smollm2_tokenizer, tokenizer_class="GPT2Tokenizer")
    model = load_served_model(str(folder), None)
    assert type(model.tokenizer).__name__.startswith("GPT2Tokenizer")
