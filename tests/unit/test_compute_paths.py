"""Every engine says which kernels it runs (EngineInfo.compute, its load log, every benchmark's
header), and the switches that force the other paths show up there."""

import pytest
import torch

from shared.attention.native_decode import PATH_ENV_VAR, load_native_decode
from shared.engine import LLM
from shared.engine.introspection import engine_info
from shared.model.config import ModelConfig
from shared.model.describe_paths import expected_cpu_paths
from shared.native import cpu_matmul
from shared.native.cpu_info import PATH_FLAGS, describe_cpu, path_flags


def tiny_llm(folder, **kwargs) -> LLM:
    return LLM(model=str(folder), dtype="bfloat16", num_blocks=32, **kwargs)


def test_the_engine_reports_the_paths_it_loaded_with(tiny_llama_folder):
    config = ModelConfig.from_folder(tiny_llama_folder)
    paths = engine_info(tiny_llm(tiny_llama_folder).engine.core).compute
    assert paths == expected_cpu_paths(config.num_heads, config.num_kv_heads, config.head_dim, torch.bfloat16, 16)
    fastest = load_native_decode().available_paths(config.num_heads, config.num_kv_heads, config.head_dim, 16,
                                                   torch.bfloat16)[-1]
    assert paths.decode_attention == f"C++ kernel, {fastest} path"
    assert paths.prompt_attention.startswith("torch SDPA (flash)") and paths.layer_ops == "C++"
    assert paths.matmul.startswith(str(cpu_matmul.cpu_matmul_dtype(torch.bfloat16)).removeprefix("torch."))


def test_forced_paths_and_deterministic_mode_show_in_the_report(tiny_llama_folder, monkeypatch):
    monkeypatch.setenv(PATH_ENV_VAR, "portable")
    monkeypatch.setenv(cpu_matmul.ENV_VAR, "float32")
    paths = engine_info(tiny_llm(tiny_llama_folder).engine.core).compute
    assert paths.decode_attention == "C++ kernel, portable path"
    assert paths.matmul == "float32 (oneDNN, bf16 weights and activations widened)"
    monkeypatch.delenv(PATH_ENV_VAR)
    monkeypatch.delenv(cpu_matmul.ENV_VAR)
    deterministic = engine_info(tiny_llm(tiny_llama_folder, deterministic=True).engine.core).compute
    assert deterministic.matmul.startswith("float32")
    assert deterministic.decode_attention in ("C++ kernel, avx512f path", "C++ kernel, portable path")
    assert deterministic.prompt_attention == f"{deterministic.decode_attention} (deterministic)"


def test_deterministic_mode_refuses_paths_it_cannot_prove(tiny_llama_folder, monkeypatch):
    monkeypatch.setenv(cpu_matmul.ENV_VAR, "bfloat16")
    with pytest.raises(Exception, match=cpu_matmul.ENV_VAR):
        tiny_llm(tiny_llama_folder, deterministic=True)


def test_the_cpu_line_names_the_model_and_the_path_flags():
    line = describe_cpu()
    assert line.startswith("CPU ") and "oneDNN bf16 on" in line
    assert set(path_flags()) <= set(PATH_FLAGS)
