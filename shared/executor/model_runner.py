"""Runs the model on one step: owns the KV cache tensor, the sampler and per-request generators.

The only code that touches the device: the cache lives there, each step's token ids,
positions and logits rows are copied there, and sampling runs on the logits where they are. With a `Speculator`, rows the scheduler let speculate
get their proposals first; the target then computes every proposed position in the same
forward pass and the speculator verifies them.

Everything after the forward pass is per request (sampling, logprobs, proposals,
verification) and runs through `run_isolated`: a request whose own computation raises is
reported in `ModelRunnerOutput.failed` and the rest of the batch gets its tokens. Only the
forward pass itself can fail the whole step.
"""

from dataclasses import replace

import torch

from shared.core.input_batch import ModelInputs, build_model_inputs
from shared.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared.engine_api.outputs import SampledLogprobs
from shared.executor.base import ModelRunnerOutput
from shared.executor.lora_slots import AdapterSlots
from shared.executor.thread_governor import ThreadGovernor
from shared.isolation import run_isolated
from shared.kv_cache.layout import KVCacheLayout
from shared.sampling.logprobs import token_logprobs, top_logprobs
from shared.sampling.random_draw import skip_draws
from shared.sampling.sampler import Sampler, SamplingRow, make_generator
from shared.spec_decode.outputs import Proposal
from shared.spec_decode.speculator import Speculator


class ModelRunner:
    def __init__(self, model: torch.nn.Module, layout: KVCacheLayout, speculator: Speculator | None = None,
                 device: torch.device | str = "cpu", adapters: AdapterSlots | None = None):
        self.model = model
        # LoRA: the adapters in the model's slots and each step's row segments (None: no LoRA).
        self.adapters = adapters
        self.layout = layout
        self.device = torch.device(device)
        self.kv_cache = layout.allocate(self.device)
        self.sampler = Sampler()
        self.speculator = speculator
        self._generators: dict[str, torch.Generator] = {}
        # Fewer threads while other processes keep our CPUs busy (CPU only).
        self.thread_governor = ThreadGovernor.for_this_process() if self.device.type == "cpu" else None

    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        for request_id in scheduler_output.finished_request_ids:
            self._generators.pop(request_id, None)
        if scheduler_output.is_empty:
            return ModelRunnerOutput()
        if self.thread_governor is not None:
            self.thread_governor.maybe_adjust()
        failed: dict[str, str] = {}
        scheduled, proposals = self._add_proposals(scheduler_output.scheduled, failed)
        if self.adapters is not None:
            scheduled = self.adapters.prepare(scheduled, failed)
            if not scheduled:
                return ModelRunnerOutput(failed=failed)
        inputs = build_model_inputs(scheduled, self.layout.block_size)
        try:
            logits = self.model(self._on_device(inputs.input_ids), self._on_device(inputs.positions), self.kv_cache,
                                inputs.attn_metadata, self._on_device(inputs.logits_indices))
        finally:
            if self.adapters is not None:
                self.adapters.clear()
        output = self._sample([item for item in scheduled if not item.draft_token_ids], logits, inputs, failed)
        output.prompt_logprobs = run_isolated(
            [item for item in scheduled if item.request_id in inputs.prompt_logit_rows],
            lambda items: _prompt_logprobs(items, logits, inputs), failed, "prompt logprobs")
        if proposals:
            output.verified = self._verify(scheduled, proposals, logits, inputs, failed)
        output.failed = failed
        return output

    def _on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, non_blocking=True)

    def _add_proposals(self, scheduled: list[ScheduledRequest], failed: dict[str, str]
                       ) -> tuple[list[ScheduledRequest], dict[str, Proposal]]:
        """The step's rows with the proposed tokens appended, and the non-empty proposals."""
        speculating = [item for item in scheduled if item.num_spec_tokens > 0]
        if self.speculator is None or not speculating:
            return scheduled, {}
        proposals = run_isolated(
            speculating, lambda items: self.speculator.propose(items, [self._generator(i) for i in items]),
            failed, "speculative proposal", self._rewinder(speculating))
        proposals = {request_id: proposal for request_id, proposal in proposals.items()
                     if proposal.draft_token_ids}
        with_drafts = []
        for item in scheduled:
            proposal = proposals.get(item.request_id)
            if proposal is not None:
                item = replace(item, token_ids=item.token_ids + proposal.draft_token_ids,
                               draft_token_ids=proposal.draft_token_ids)
            with_drafts.append(item)
        return with_drafts, proposals

    def _verify(self, scheduled: list[ScheduledRequest], proposals: dict[str, Proposal],
                logits: torch.Tensor, inputs: ModelInputs, failed: dict[str, str]):
        def verify(items: list[ScheduledRequest]):
            return self.speculator.verify(
                items, logits, [inputs.sample_logit_rows[item.request_id] for item in items],
                [proposals[item.request_id] for item in items], [self._generator(item) for item in items])

        items = [item for item in scheduled if item.draft_token_ids]
        return run_isolated(items, verify, failed, "speculative verification", self._rewinder(items))

    def _sample(self, items: list[ScheduledRequest], logits: torch.Tensor, inputs: ModelInputs,
                failed: dict[str, str]) -> ModelRunnerOutput:
        items = [item for item in items if item.sampling_params is not None]
        results = run_isolated(items, lambda batch: self._sample_batch(batch, logits, inputs), failed,
                               "sampling", self._rewinder(items))
        output = ModelRunnerOutput()
        for request_id, (token_id, logprobs) in results.items():
            output.sampled_token_ids[request_id] = token_id
            if logprobs is not None:
                output.logprobs[request_id] = logprobs
        return output

    def _sample_batch(self, items: list[ScheduledRequest], logits: torch.Tensor,
                      inputs: ModelInputs) -> dict[str, tuple[int, SampledLogprobs | None]]:
        rows = [self._sampling_row(item) for item in items]
        sampled = self.sampler(_logit_rows(logits, [inputs.sample_logit_rows[item.request_id] for item in items]),
                               rows)
        results = {}
        for index, item in enumerate(items):
            logprobs = None
            if item.sampling_params.logprobs is not None:
                logprobs = SampledLogprobs(sampled.sampled_logprobs[index], sampled.top_logprobs[index])
            results[item.request_id] = (sampled.sampled_token_ids[index], logprobs)
        return results

    def _rewinder(self, items: list[ScheduledRequest]):
        """A callable that puts the seeded generators of `items` back where they are now, so
        that retrying rows one by one draws what the batch would have drawn."""
        generators = [generator for generator in map(self._generator, items) if generator is not None]
        states = [generator.get_state() for generator in generators]

        def rewind() -> None:
            for generator, state in zip(generators, states):
                generator.set_state(state)
        return rewind

    def _generator(self, item: ScheduledRequest) -> torch.Generator | None:
        """A seeded request's own generator, made on its first sampling step (skipping the
        draws of tokens sampled elsewhere: a prefill instance sampled the first token)."""
        params = item.sampling_params
        if params.seed is None:
            return None
        generator = self._generators.get(item.request_id)
        if generator is None:
            generator = self._generators[item.request_id] = make_generator(params.seed)
            if not params.is_greedy:
                skip_draws(generator, len(item.output_token_ids))
        return generator

    def _sampling_row(self, item: ScheduledRequest) -> SamplingRow:
        return SamplingRow(params=item.sampling_params, prompt_token_ids=item.prompt_token_ids,
                           output_token_ids=item.output_token_ids, generator=self._generator(item),
                           stop_and_eos_token_ids=item.stop_and_eos_token_ids,
                           guided_bitmask=item.guided_bitmask)


def _logit_rows(logits: torch.Tensor, row_indices: list[int]) -> torch.Tensor:
    """Those rows of `logits`, in that order; `logits` itself, not a copy, when that is every
    row in order (the common step: each logits row samples a token)."""
    if row_indices == list(range(logits.shape[0])):
        return logits
    return logits[torch.tensor(row_indices, device=logits.device)]


def _prompt_logprobs(scheduled: list[ScheduledRequest], logits: torch.Tensor,
                     inputs: ModelInputs) -> dict[str, list[SampledLogprobs]]:
    """Per request, the logprob of each next prompt token and the top alternatives there."""
    result = {}
    for item in scheduled:
        if item.request_id not in inputs.prompt_logit_rows:
            continue
        first, count = inputs.prompt_logit_rows[item.request_id]
        logprobs = torch.log_softmax(logits[first:first + count].float(), dim=-1)
        target_lps = token_logprobs(logprobs, torch.tensor(item.prompt_logprob_targets, device=logits.device))
        tops = top_logprobs(logprobs, [item.num_prompt_logprobs] * count)
        result[item.request_id] = [SampledLogprobs(lp, top) for lp, top in zip(target_lps, tops)]
    return result
