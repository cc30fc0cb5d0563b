"""The gateway starts from a model folder holding only config.json and the tokenizer."""

import json

from services.gateway.served_model import load_served_model
from tests.unit.conftest import TINY_LLAMA
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture


def test_weightless_folder_is_enough(tmp_path, smollm2_tokenizer):  # noqa: F811
    folder = tmp_path / "my-model"
    smollm2_tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({
        **TINY_LLAMA, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152}))
    model = load_served_model(str(folder), None, max_model_len=100)
    assert (model.name, model.model_key) == ("my-model", "my-model")
    assert (model.vocab_size, model.max_model_len) == (49152, 100)  # min(config's 128, 100)
    assert model.tokenizer.encode("Hello", add_special_tokens=False) == \
        smollm2_tokenizer.encode("Hello", add_special_tokens=False)
    assert model.accepts("") and model.accepts("my-model") and not model.accepts("other")
    renamed = load_served_model(str(folder), "public-name")
    assert (renamed.name, renamed.model_key, renamed.max_model_len) == ("public-name", "my-model", 128)
    assert renamed.accepts("my-model")
