"""The executor that runs the model in the engine's own process."""

import torch

from shared.core.scheduler_output import SchedulerOutput
from shared.executor.base import Executor, ModelRunnerOutput
from shared.executor.lora_slots import AdapterSlots
from shared.executor.model_runner import ModelRunner
from shared.kv_cache.layout import KVCacheLayout
from shared.spec_decode.speculator import Speculator


class InProcessExecutor(Executor):
    def __init__(self, model: torch.nn.Module, layout: KVCacheLayout, speculator: Speculator | None = None,
                 device: torch.device | str = "cpu", adapters: AdapterSlots | None = None):
        self.runner = ModelRunner(model, layout, speculator, device, adapters)

    @property
    def kv_cache_layout(self) -> KVCacheLayout:
        return self.runner.layout

    @property
    def kv_cache(self) -> torch.Tensor:
        """The cache tensor itself (KV transfer reads and writes blocks here)."""
        return self.runner.kv_cache

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute(scheduler_output)

    def resident_lora_ids(self) -> list[int]:
        return self.runner.adapters.resident_ids() if self.runner.adapters is not None else []

    def shutdown(self) -> None:
        self.runner.kv_cache = torch.empty(0)
        proposer = getattr(self.runner.speculator, "proposer", None)
        if hasattr(proposer, "kv_cache"):
            proposer.kv_cache = torch.empty(0)
