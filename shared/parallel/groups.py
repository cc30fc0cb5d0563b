"""One worker's place in the (pipeline stage, tensor rank) grid and its process groups.

Global rank = stage * tensor_parallel_size + tensor_rank. Every stage has its own tensor group
(the all-reduces of its layers); stage s sends activations to the same tensor rank of s + 1.
Time spent in collectives and point-to-point transfers is summed in `comm_seconds`.
"""

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class ParallelGroups:
    rank: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    tensor_group: object | None = None
    comm_seconds: float = field(default=0.0)

    @property
    def tensor_rank(self) -> int:
        return self.rank % self.tensor_parallel_size

    @property
    def stage(self) -> int:
        return self.rank // self.tensor_parallel_size

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.pipeline_parallel_size - 1

    @property
    def is_output_rank(self) -> bool:
        """The one rank that samples and answers the engine: tensor rank 0 of the last stage."""
        return self.is_last_stage and self.tensor_rank == 0

    def peer_in_stage(self, stage: int) -> int:
        return stage * self.tensor_parallel_size + self.tensor_rank

    @contextmanager
    def timed(self):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.comm_seconds += time.perf_counter() - started

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the stage's tensor ranks, in place."""
        if self.tensor_parallel_size > 1:
            with self.timed():
                dist.all_reduce(tensor, group=self.tensor_group)
        return tensor

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate every tensor rank's `tensor` along the last dimension, in rank order."""
        if self.tensor_parallel_size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.tensor_parallel_size)]
        with self.timed():
            dist.all_gather(parts, tensor.contiguous(), group=self.tensor_group)
        return torch.cat(parts, dim=-1)


def create_groups(rank: int, tensor_parallel_size: int, pipeline_parallel_size: int) -> ParallelGroups:
    """After init_process_group: make every stage's tensor group (all ranks must call this)."""
    groups = ParallelGroups(rank, tensor_parallel_size, pipeline_parallel_size)
    for stage in range(pipeline_parallel_size):
        members = list(range(stage * tensor_parallel_size, (stage + 1) * tensor_parallel_size))
        group = dist.new_group(members)
        if stage == groups.stage:
            groups.tensor_group = group
    return groups
