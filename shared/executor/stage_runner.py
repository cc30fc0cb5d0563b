"""The model runner of one tensor/pipeline-parallel worker.

Every rank runs every step on the same message. With several pipeline stages the step's
requests are split into micro-batches (one per stage, by token count): stage s computes
micro-batch i + 1 while stage s + 1 computes micro-batch i, so the stages overlap within a
step instead of waiting for one another. Activations travel stage to stage, tensor rank to the
same tensor rank, with non-blocking sends. Only the output rank (tensor rank 0 of the last
stage) samples; the others' logits are identical copies (the LM head gathers the vocabulary).
"""

import torch
import torch.distributed as dist

from shared.core.input_batch import ModelInputs, build_model_inputs
from shared.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared.executor.base import ModelRunnerOutput
from shared.executor.lora_slots import AdapterSlots
from shared.executor.model_runner import ModelRunner, _prompt_logprobs
from shared.isolation import run_isolated
from shared.kv_cache.layout import KVCacheLayout
from shared.model.llama import LlamaForCausalLM
from shared.parallel.groups import ParallelGroups
from shared.parallel.stage_forward import forward_stage


class StageRunner(ModelRunner):
    def __init__(self, model: LlamaForCausalLM, layout: KVCacheLayout, groups: ParallelGroups,
                 kv_cache: torch.Tensor, adapters: AdapterSlots | None = None):
        super().__init__(model, layout, adapters=adapters)
        # The shard lives in shared memory (kv_shards.py) so the engine can move KV in and out.
        self.kv_cache = kv_cache
        self.groups = groups
        self.hidden_size = model.config.hidden_size

    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        for request_id in scheduler_output.finished_request_ids:
            self._generators.pop(request_id, None)
        output = ModelRunnerOutput()
        sends = []
        for index, batch in enumerate(split_micro_batches(scheduler_output.scheduled,
                                                          self.groups.pipeline_parallel_size)):
            batch = self._order_for_adapters(batch, output.failed)
            if not batch:
                continue
            inputs = build_model_inputs(batch, self.layout.block_size)
            try:
                result = self._forward(index, inputs)
            finally:
                if self.adapters is not None:
                    self.adapters.clear()
            if not self.groups.is_last_stage:
                sends.append(self._send(index, result))
            elif self.groups.is_output_rank:
                self._sample_micro_batch(output, batch, result, inputs)
        with self.groups.timed():
            for work, _ in sends:
                work.wait()
        return output

    def _order_for_adapters(self, batch: list[ScheduledRequest], failed: dict[str, str]) -> list[ScheduledRequest]:
        """With LoRA: the micro-batch in adapter order, its row segments set (AdapterSlots.prepare).
        Every rank of a stage reads the same folders; one that cannot read an adapter another can
        computes other rows, the collectives fail and the engine reports the worker failure."""
        if self.adapters is None:
            return batch
        return self.adapters.prepare(batch, failed)

    def _sample_micro_batch(self, output: ModelRunnerOutput, batch: list[ScheduledRequest],
                            logits: torch.Tensor, inputs: ModelInputs) -> None:
        """Sample and score one micro-batch into `output`; a request whose own sampling fails
        lands in `output.failed` alone (as in ModelRunner)."""
        sampled = self._sample(batch, logits, inputs, output.failed)
        output.sampled_token_ids.update(sampled.sampled_token_ids)
        output.logprobs.update(sampled.logprobs)
        output.prompt_logprobs.update(run_isolated(
            [item for item in batch if item.request_id in inputs.prompt_logit_rows],
            lambda items: _prompt_logprobs(items, logits, inputs), output.failed, "prompt logprobs"))

    def _forward(self, index: int, inputs: ModelInputs) -> torch.Tensor:
        hidden = None if self.groups.is_first_stage else self._receive(index, len(inputs.input_ids))
        logits_indices = inputs.logits_indices if self.groups.is_last_stage else None
        return forward_stage(self.model, inputs.input_ids, inputs.positions, hidden, self.kv_cache,
                             inputs.attn_metadata, logits_indices)

    def _receive(self, index: int, num_tokens: int) -> torch.Tensor:
        hidden = torch.empty(num_tokens, self.hidden_size, dtype=self.layout.dtype)
        with self.groups.timed():
            dist.recv(hidden, src=self.groups.peer_in_stage(self.groups.stage - 1), tag=index)
        return hidden

    def _send(self, index: int, hidden: torch.Tensor):
        hidden = hidden.contiguous()
        with self.groups.timed():
            work = dist.isend(hidden, dst=self.groups.peer_in_stage(self.groups.stage + 1), tag=index)
        return work, hidden  # the tensor must outlive the send


def split_micro_batches(scheduled: list[ScheduledRequest], num_batches: int) -> list[list[ScheduledRequest]]:
    """At most `num_batches` contiguous groups of requests with similar token counts."""
    if num_batches <= 1 or len(scheduled) <= 1:
        return [scheduled] if scheduled else []
    total = sum(item.num_tokens for item in scheduled)
    batches, current, tokens_so_far = [], [], 0
    for item in scheduled:
        current.append(item)
        tokens_so_far += item.num_tokens
        if len(batches) < num_batches - 1 and tokens_so_far * num_batches >= total * (len(batches) + 1):
            batches.append(current)
            current = []
    if current:
        batches.append(current)
    return batches

