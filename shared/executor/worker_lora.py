"""LoRA on one tensor/pipeline-parallel worker: LoRA layers on its model shard, adapters cut to it.

The layers go on the packed shard before the communicating layers (`before_parallel` of
load_model_shard), so a row-parallel projection's delta is part of the partial output the
all-reduce sums. Each worker reads an adapter's folder itself when a step first needs it and
keeps its rank's slice (shared.parallel.lora_sharding); the engine ships only the request's
`LoRARequest` in the step message.
"""

from functools import partial

import torch

from shared.executor.lora_slots import AdapterSlots
from shared.lora.config import LoRAConfig
from shared.lora.layers import StepAdapters, attach_lora
from shared.model.config import ModelConfig
from shared.parallel.config import stage_layers
from shared.parallel.groups import ParallelGroups
from shared.parallel.lora_sharding import shard_adapter


class WorkerAdapters:
    """Builds the shard's AdapterSlots when the model is ready (`attach`, a before_parallel hook)."""

    def __init__(self, config: LoRAConfig, full_config: ModelConfig, groups: ParallelGroups, dtype: torch.dtype):
        self.config = config
        self.dtype = dtype
        layers = stage_layers(full_config.num_layers, groups.pipeline_parallel_size, groups.stage)
        self.shard = partial(shard_adapter, tensor_rank=groups.tensor_rank,
                             tensor_parallel_size=groups.tensor_parallel_size, layers=layers)
        self.slots: AdapterSlots | None = None

    def attach(self, model: torch.nn.Module) -> None:
        step = StepAdapters()
        layers = attach_lora(model, step, self.config.max_loras)
        self.slots = AdapterSlots(layers, step, self.config, torch.device("cpu"), self.dtype, self.shard)
