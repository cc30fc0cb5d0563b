"""Sampling: request parameters (`SamplingParams`) and the batched sampler (`sampler.Sampler`)."""

from shared.sampling.params import SamplingParams

__all__ = ["SamplingParams"]
