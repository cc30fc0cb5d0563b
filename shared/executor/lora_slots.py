"""The model runner's side of LoRA: which adapters sit in the step's slots, and their rows.

`AdapterSlots.prepare(scheduled)` runs before each forward pass. It orders the step's requests
so that each adapter's rows are contiguous (decodes by adapter, then prompt chunks by adapter),
puts every adapter the step uses into a slot (reusing one that holds it, else a free one, else
the least recently used one the step does not need), and sets the row segments the LoRA layers
read. Adapter weights are read from disk on first use and kept, least recently used dropped
first, up to `max_cpu_loras` adapters.
"""

from collections import OrderedDict
from collections.abc import Callable
from itertools import groupby

import torch

from shared.core.scheduler_output import ScheduledRequest
from shared.lora.config import LoRAConfig
from shared.lora.layers import LoRALinear, StepAdapters
from shared.lora.peft_format import AdapterWeights, read_adapter
from shared.lora.request import LoRARequest


class AdapterSlots:
    def __init__(self, layers: list[LoRALinear], step: StepAdapters, config: LoRAConfig,
                 device: torch.device, dtype: torch.dtype, shard: Callable[[dict], dict] | None = None):
        """`shard`: a tensor/pipeline-parallel rank's cut of an adapter's modules, applied when read."""
        self.layers = layers
        self.shard = shard
        self.step = step
        self.config = config
        self.device = device
        self.dtype = dtype
        self._loaded: OrderedDict[int, AdapterWeights] = OrderedDict()  # by lora_int_id, LRU first
        self._slot_owner: list[int | None] = [None] * config.max_loras  # lora_int_id per slot
        self._slot_last_used: list[int] = [0] * config.max_loras
        self._num_steps = 0

    def prepare(self, scheduled: list[ScheduledRequest], failed: dict[str, str]) -> list[ScheduledRequest]:
        """The step's requests in row order (see the module doc), segments set for them. A
        request whose adapter cannot be read (its folder changed since admission) goes into
        `failed` and out of the step; the others run."""
        self._num_steps += 1
        wanted = {item.lora_request.lora_int_id: item.lora_request for item in scheduled if item.lora_request}
        if len(wanted) > self.config.max_loras:
            raise RuntimeError(f"a step uses {len(wanted)} adapters, more than max_loras={self.config.max_loras}")
        unreadable = self._read_all(wanted)
        for item in scheduled:
            if item.lora_request is not None and item.lora_request.lora_int_id in unreadable:
                failed[item.request_id] = unreadable[item.lora_request.lora_int_id]
        ordered = sorted((item for item in scheduled if item.request_id not in failed),
                         key=lambda item: (not (item.is_decode or item.draft_token_ids), _adapter_id(item.lora_request)))
        slot_of = self._assign_slots({lora_id: request for lora_id, request in wanted.items()
                                      if lora_id not in unreadable})
        self.step.set(_segments(ordered, slot_of))
        return ordered

    def _read_all(self, wanted: dict[int, LoRARequest]) -> dict[int, str]:
        """Read every wanted adapter not in memory yet; returns the errors of those that failed."""
        errors = {}
        for lora_id, request in wanted.items():
            try:
                self._weights(request)
            except Exception as error:  # one adapter's bad folder fails its requests only
                errors[lora_id] = f"LoRA adapter {request.lora_name!r} could not be read: {error}"
        return errors

    def resident_ids(self) -> list[int]:
        """The lora_int_ids of the adapters in memory now, least recently used first."""
        return list(self._loaded)

    def clear(self) -> None:
        self.step.set([])

    def forget(self, lora_int_id: int) -> None:
        """An adapter was unloaded: drop its weights and free its slot."""
        self._loaded.pop(lora_int_id, None)
        for slot, owner in enumerate(self._slot_owner):
            if owner == lora_int_id:
                self._slot_owner[slot] = None

    def _assign_slots(self, wanted: dict[int, LoRARequest]) -> dict[int, int]:
        slot_of = {owner: slot for slot, owner in enumerate(self._slot_owner) if owner in wanted}
        for lora_id, request in wanted.items():
            if lora_id not in slot_of:
                slot = self._free_slot(set(slot_of.values()))
                self._fill(slot, request)
                slot_of[lora_id] = slot
        for slot in slot_of.values():
            self._slot_last_used[slot] = self._num_steps
        return slot_of

    def _free_slot(self, taken: set[int]) -> int:
        candidates = [slot for slot in range(len(self._slot_owner)) if slot not in taken]
        empty = [slot for slot in candidates if self._slot_owner[slot] is None]
        return empty[0] if empty else min(candidates, key=lambda slot: self._slot_last_used[slot])

    def _fill(self, slot: int, request: LoRARequest) -> None:
        weights = self._weights(request)
        for layer in self.layers:
            layer.set_slot(slot, {module: tensors for (index, module), tensors in weights.items()
                                  if index == layer.layer_index})
        self._slot_owner[slot] = request.lora_int_id

    def _weights(self, request: LoRARequest) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
        adapter = self._loaded.pop(request.lora_int_id, None)
        if adapter is None:
            adapter = read_adapter(request.lora_path)
            if self.shard is not None:
                adapter.modules = self.shard(adapter.modules)
            adapter.modules = {key: (a.to(self.device, self.dtype), b.to(self.device, self.dtype))
                               for key, (a, b) in adapter.modules.items()}
        self._loaded[request.lora_int_id] = adapter
        while len(self._loaded) > self.config.num_cached_adapters:
            self._loaded.popitem(last=False)
        return adapter.modules


def _adapter_id(request: LoRARequest | None) -> int:
    return request.lora_int_id if request is not None else 0


def _segments(ordered: list[ScheduledRequest], slot_of: dict[int, int]) -> list[tuple[int, int, int]]:
    """(first row, end row, slot) of each run of rows that use one adapter."""
    segments, row = [], 0
    for lora_id, items in groupby(ordered, key=lambda item: _adapter_id(item.lora_request)):
        num_rows = sum(item.num_tokens for item in items)
        if lora_id:
            segments.append((row, row + num_rows, slot_of[lora_id]))
        row += num_rows
    return segments
