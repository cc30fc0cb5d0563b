"""Device selection (shared/engine/device.py) and the device flags, on a machine without a GPU."""

import pytest
import torch

from shared.attention.torch_paged import TorchPagedAttention
from shared.config import EngineConfig
from shared.engine.device import kv_cache_memory_bytes, make_attention_backend, resolve_device
from shared.errors import ConfigurationError
from shared.model.config import ModelConfig
from services.instance.settings import InstanceSettings

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


def tiny_model_config() -> ModelConfig:
    return ModelConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                       num_kv_heads=1, head_dim=8, max_position_embeddings=16, rms_norm_eps=1e-5,
                       rope_theta=1e4, tie_word_embeddings=True, bos_token_id=None, eos_token_ids=())


def test_auto_is_the_cpu_without_a_gpu(monkeypatch):
    monkeypatch.delenv("PDSERVE_DEVICE", raising=False)
    assert resolve_device("auto") == torch.device("cpu")


def test_pdserve_device_overrides_auto(monkeypatch):
    monkeypatch.setenv("PDSERVE_DEVICE", "cuda")
    with pytest.raises(ConfigurationError, match="device.*no GPU"):
        resolve_device("auto")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name, message", [("cuda", "no GPU"), ("tpu", "not a device"), ("meta", "auto, cpu")])
def test_unusable_devices_are_refused_by_name(name, message):
    with pytest.raises(ConfigurationError, match=message) as raised:
        resolve_device(name)
    assert raised.value.field == "device"


def test_the_cpu_keeps_its_configured_kv_budget():
    config = EngineConfig()
    config.cache.kv_cache_memory_bytes = 12345
    assert kv_cache_memory_bytes(config, torch.device("cpu")) == 12345


def test_auto_backend_on_the_cpu_is_torch_and_bad_names_are_refused():
    config = tiny_model_config()
    assert isinstance(make_attention_backend("auto", torch.device("cpu"), config), TorchPagedAttention)
    with pytest.raises(ConfigurationError, match="attention_backend"):
        make_attention_backend("flash", torch.device("cpu"), config)


def test_instance_settings_check_gpu_memory_utilization():
    assert InstanceSettings(device="cuda", gpu_memory_utilization=0.4).engine.device == "cuda"
    with pytest.raises(ConfigurationError, match="gpu_memory_utilization"):
        InstanceSettings(gpu_memory_utilization=1.5)


def test_up_passes_device_flags_to_every_instance():
    from services.cli.main import build_parser
    from services.cli.up_command import config_from_args
    args = build_parser().parse_args(["up", "--device", "cuda", "--gpu-memory-utilization", "0.4"])
    assert config_from_args(args).extra_args["instance"] == ["--device=cuda", "--gpu-memory-utilization=0.4"]


def test_gpu_budget_is_this_engines_share_less_its_weights_and_never_more_than_free(monkeypatch):
    gib = 1 << 30
    config = EngineConfig()
    config.cache.gpu_memory_utilization = 0.4
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 2 * gib)  # this process: weights
    # Another engine already holds 40 of 100 GiB: this one still gets its own 40% share.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (58 * gib, 100 * gib))
    assert kv_cache_memory_bytes(config, torch.device("cuda", 0)) == 40 * gib - 2 * gib - gib
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10 * gib, 100 * gib))
    assert kv_cache_memory_bytes(config, torch.device("cuda", 0)) == 10 * gib - gib
    config.cache.gpu_memory_utilization = 1.5
    with pytest.raises(ConfigurationError, match="gpu_memory_utilization"):
        kv_cache_memory_bytes(config, torch.device("cuda", 0))


def test_offline_command_has_the_device_flags():
    from services.cli.main import build_parser
    from services.settings.engine_flags import engine_args_from
    args = build_parser().parse_args(["offline", "hi", "--device", "cpu", "--attention-backend", "torch"])
    engine_args = engine_args_from(args)
    assert (engine_args.device, engine_args.gpu_memory_utilization, engine_args.attention_backend) == ("cpu", 0.9, "torch")


def test_the_triton_backend_on_the_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    config = tiny_model_config()
    with pytest.raises(ConfigurationError, match="TRITON_INTERPRET"):
        make_attention_backend("triton", torch.device("cpu"), config)
