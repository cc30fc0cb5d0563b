"""Uniform numbers for speculative steps, from each request's own generator when seeded.

A seeded request draws from its generator (kept by the model runner for the request's
life), so its results repeat run to run; unseeded requests share the global generator, as in
`shared.sampling.random_draw`.
"""

from collections.abc import Sequence

import torch


def draw_per_request(generators: Sequence[torch.Generator | None], counts: Sequence[int],
                     global_generator: torch.Generator | None) -> list[torch.Tensor]:
    """counts[i] uniforms in [0, 1) for request i, from generators[i] or the global one."""
    unseeded = [index for index, generator in enumerate(generators) if generator is None]
    shared = torch.rand(sum(counts[index] for index in unseeded), generator=global_generator)
    pieces = iter(shared.split([counts[index] for index in unseeded]))
    uniforms = []
    for generator, count in zip(generators, counts):
        uniforms.append(next(pieces) if generator is None else torch.rand(count, generator=generator))
    return uniforms
