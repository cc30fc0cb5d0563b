"""The default model, end to end: the real SmolLM2 GGUF converted into a fresh cache.

One conversion per test session: two processes race to resolve the default model into an
empty cache under pytest's tmp dir; every other test uses the folder they agreed on.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from shared.model.default_model import default_gguf_path, resolve_model

REPO_ROOT = Path(__file__).resolve().parents[2]
CONVERSION_LOG_LINE = "shared.model.gguf_convert Converting"
RESOLVE_SCRIPT = (
    "import logging\n"
    "logging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
    "from shared.model.default_model import resolve_model\n"
    "print(resolve_model(None))\n"
)
SKY_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def fresh_cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pdserve-cache")


@pytest.fixture(scope="module")
def racing_resolutions(fresh_cache_dir, tmp_path_factory) -> list[subprocess.CompletedProcess]:
    """Two processes started together, each running `resolve_model(None)` on the empty cache.

    Output goes to files, not pipes, so a process holding the lock can never block on a full pipe.
    """
    env = {**os.environ, "PDSERVE_CACHE_DIR": str(fresh_cache_dir), "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-c", RESOLVE_SCRIPT]
    log_dir = tmp_path_factory.mktemp("racing-logs")
    log_paths = [(log_dir / f"{index}.out", log_dir / f"{index}.err") for index in range(2)]
    processes = []
    for stdout_path, stderr_path in log_paths:
        with open(stdout_path, "w") as stdout_file, open(stderr_path, "w") as stderr_file:
            processes.append(subprocess.Popen(
                command, cwd=REPO_ROOT, env=env, stdout=stdout_file, stderr=stderr_file
            ))
    return [
        subprocess.CompletedProcess(
            command, process.wait(timeout=300), stdout_path.read_text(), stderr_path.read_text()
        )
        for process, (stdout_path, stderr_path) in zip(processes, log_paths)
    ]


@pytest.fixture(scope="module")
def converted_folder(racing_resolutions) -> Path:
    return Path(racing_resolutions[0].stdout.strip())


@pytest.fixture(scope="module")
def tokenizer(converted_folder):
    return AutoTokenizer.from_pretrained(converted_folder)


@pytest.fixture(scope="module")
def converted_model(converted_folder):
    return AutoModelForCausalLM.from_pretrained(converted_folder, dtype=torch.float32).eval()


def test_two_racing_processes_make_one_folder_with_one_conversion(racing_resolutions, fresh_cache_dir):
    assert [run.returncode for run in racing_resolutions] == [0, 0], racing_resolutions
    folders = {run.stdout.strip() for run in racing_resolutions}
    assert len(folders) == 1
    folder = Path(folders.pop())
    assert sum(run.stderr.count(CONVERSION_LOG_LINE) for run in racing_resolutions) == 1
    models_dir = fresh_cache_dir / "models"
    assert sorted(path.name for path in models_dir.iterdir()) == [folder.name, f"{folder.name}.lock"]
    assert sorted(path.name for path in folder.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "pdserve_conversion.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_second_resolution_reuses_the_folder(converted_folder, fresh_cache_dir):
    weights_mtime = (converted_folder / "model.safetensors").stat().st_mtime_ns
    started = time.perf_counter()
    assert resolve_model(None, cache_dir=fresh_cache_dir) == converted_folder
    assert time.perf_counter() - started < 0.5
    assert (converted_folder / "model.safetensors").stat().st_mtime_ns == weights_mtime


def test_config_carries_the_gguf_metadata(converted_folder):
    config = json.loads((converted_folder / "config.json").read_text())
    expected = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-05,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": True,
    }
    assert {key: config[key] for key in expected} == expected


def test_logits_match_transformers_loading_the_gguf(converted_model, tokenizer):
    gguf_path = default_gguf_path()
    reference_model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    input_ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = converted_model(input_ids).logits
        reference_logits = reference_model(input_ids).logits
    assert logits.shape == (1, input_ids.shape[1], 49152)
    torch.testing.assert_close(logits, reference_logits, atol=1e-5, rtol=0)


def test_greedy_answer_is_coherent_english(converted_model, tokenizer):
    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    output_ids = converted_model.generate(**inputs, max_new_tokens=10, do_sample=False)
    answer = tokenizer.decode(output_ids[0, inputs["input_ids"].shape[1]:])
    assert answer == "The answer to this question lies in the intricate dance"


def test_tokenizer_round_trips_text(tokenizer):
    text = "Hello, world! The sky is blue because of Rayleigh scattering."
    token_ids = tokenizer(text).input_ids
    assert token_ids[:2] == [19556, 28]  # "Hello", ","; no BOS is prepended
    assert tokenizer.decode(token_ids) == text


def test_chat_template_is_saved_in_tokenizer_config(converted_folder, tokenizer):
    saved_config = json.loads((converted_folder / "tokenizer_config.json").read_text())
    assert saved_config["chat_template"].startswith("{% for message in messages %}")
    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == SKY_PROMPT
