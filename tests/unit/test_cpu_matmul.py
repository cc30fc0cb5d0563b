"""The CPU matmul dtype for bf16 models: native bf16 where the CPU has it, fp32 compute on
upcast weights where it does not, and both agree with an fp32 reference as bf16 does."""

import pytest
import torch

from shared.errors import ConfigurationError
from shared.native import cpu_matmul
from shared.model.config import ModelConfig
from shared.native.cpu_matmul import cpu_flags, cpu_matmul_dtype
from shared.model.llama import LlamaMLP
from shared.model.packed_linear import PackedGatedMLP, PackedLinear, can_pack

needs_onednn_bf16 = pytest.mark.skipif(not can_pack(torch.bfloat16), reason="oneDNN without bf16 kernels")


def test_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni\n\nprocessor\t: 1\nflags\t: x\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx512f", "avx512_vnni"}
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert "bf16" in cpu_flags(cpuinfo)


def test_unreadable_cpuinfo_keeps_the_bf16_path(tmp_path):
    assert cpu_flags(tmp_path / "missing") & cpu_matmul.NATIVE_BF16_FLAGS


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_computes_bf16_in_fp32_only_without_bf16_hardware(monkeypatch, native, expected):
    monkeypatch.delenv(cpu_matmul.ENV_VAR, raising=False)
    monkeypatch.setattr(cpu_matmul, "has_native_bf16_matmul", lambda: native)
    assert cpu_matmul_dtype(torch.bfloat16) == expected
    assert cpu_matmul_dtype(torch.float32) == torch.float32


@pytest.mark.parametrize("value, expected", [("bf16", torch.bfloat16), ("float32", torch.float32)])
def test_the_environment_forces_a_choice(monkeypatch, value, expected):
    monkeypatch.setenv(cpu_matmul.ENV_VAR, value)
    monkeypatch.setattr(cpu_matmul, "has_native_bf16_matmul", lambda: expected == torch.float32)
    assert cpu_matmul_dtype(torch.bfloat16) == expected


def test_an_unknown_choice_names_the_variable(monkeypatch):
    monkeypatch.setenv(cpu_matmul.ENV_VAR, "fp8")
    with pytest.raises(ConfigurationError) as error:
        cpu_matmul_dtype(torch.bfloat16)
    assert error.value.field == cpu_matmul.ENV_VAR


def _mlp() -> LlamaMLP:
    config = ModelConfig(vocab_size=8, hidden_size=64, intermediate_size=96, num_layers=1, num_heads=4,
                         num_kv_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5,
                         rope_theta=1e4, tie_word_embeddings=True, bos_token_id=None, eos_token_ids=())
    torch.manual_seed(0)
    mlp = LlamaMLP(config)
    for parameter in mlp.parameters():
        parameter.data.normal_(0, 0.1)
    return mlp.to(torch.bfloat16).eval()


@needs_onednn_bf16
@pytest.mark.parametrize("compute_dtype", [torch.bfloat16, torch.float32])
def test_packed_layers_take_and_return_bf16_whatever_they_compute_in(compute_dtype):
    mlp = _mlp()
    x = torch.randn(13, 64).to(torch.bfloat16)
    with torch.no_grad():
        reference = mlp.float()(x.float())
        packed = PackedGatedMLP(_mlp(), compute_dtype)(x)
    assert packed.dtype == torch.bfloat16 and packed.shape == (13, 64)
    torch.testing.assert_close(packed.float(), reference, atol=0.02, rtol=0.02)


@needs_onednn_bf16
def test_fp32_compute_matches_bf16_compute_to_a_bf16_step():
    torch.manual_seed(1)
    linear = torch.nn.Linear(576, 960, bias=False).to(torch.bfloat16)
    x = torch.randn(64, 576).to(torch.bfloat16)
    with torch.no_grad():
        native = PackedLinear(linear, torch.bfloat16)(x).float()
        upcast = PackedLinear(linear, torch.float32)(x).float()
    assert PackedLinear(linear, torch.float32).packed_weight.dtype == torch.float32
    differ = native != upcast
    assert differ.float().mean() < 0.01  # only where fp32 sums round across a bf16 boundary
    step = torch.finfo(torch.bfloat16).eps * native.abs().clamp_min(1e-3)
    assert bool(((native - upcast).abs() <= step * 1.01)[differ].all())
