"""Which CPUs each engine instance of a local stack gets, and how many threads it runs.

`pdserve up` never oversubscribes the host: without `--prefill-cpus` / `--decode-cpus`, when
the launcher may use at least one CPU per instance, the instances get disjoint, contiguous
sets of them (as equal as possible, the first instances taking the remainder) and each runs
one thread per CPU it was given; with fewer CPUs than instances nothing is pinned and each
runs one thread. With explicit CPU lists, the instances of a role share their list and split
its threads. `--num-threads` always wins for the thread count. Instances added later (scale
out) float over every CPU with the thread count the whole stack would split to.
"""

from dataclasses import dataclass

from services.launcher.config import StackConfig
from shared.native.cpu_matmul import cpu_flags

BF16_HARDWARE_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class InstanceCpus:
    # CPU ids the instance is pinned to; None: not pinned.
    cpus: tuple[int, ...] | None
    num_threads: int


def plan_instance_cpus(config: StackConfig, names_and_roles: list[tuple[str, str]],
                       available: list[int]) -> dict[str, InstanceCpus]:
    """name -> InstanceCpus for the stack's first instances, given the CPUs the launcher may use."""
    explicit = {role: config.cpus_of(role) for _, role in names_and_roles}
    if any(cpus is not None for cpus in explicit.values()):
        return {name: _shared_list(config, role, explicit[role], names_and_roles, available)
                for name, role in names_and_roles}
    if len(available) < len(names_and_roles) or not names_and_roles:
        return {name: InstanceCpus(None, config.num_threads or 1) for name, _ in names_and_roles}
    if resolve_cpu_layout(config.cpu_layout) == "shared":
        every = tuple(available)
        return {name: InstanceCpus(every, config.num_threads or len(every)) for name, _ in names_and_roles}
    plan = {}
    slices = _split(available, len(names_and_roles))
    for (name, _), cpus in zip(names_and_roles, slices):
        plan[name] = InstanceCpus(tuple(cpus), config.num_threads or len(cpus))
    return plan


def resolve_cpu_layout(layout: str, flags: frozenset[str] | None = None) -> str:
    """"disjoint" or "shared"; "auto" is shared where bf16 matmuls run in hardware."""
    if layout != "auto":
        return layout
    flags = cpu_flags() if flags is None else flags
    return "shared" if any(flag in flags for flag in BF16_HARDWARE_FLAGS) else "disjoint"


def cpus_for_new_instance(config: StackConfig, role: str, num_instances: int, available: list[int]) -> InstanceCpus:
    """A scale-out instance: its role's explicit list if any, else floating."""
    cpus = config.cpus_of(role)
    if cpus is not None:
        return InstanceCpus(cpus, config.num_threads or max(1, len(cpus)))
    return InstanceCpus(None, config.num_threads or max(1, len(available) // max(1, num_instances)))


def _shared_list(config: StackConfig, role: str, cpus: tuple[int, ...] | None,
                 names_and_roles: list[tuple[str, str]], available: list[int]) -> InstanceCpus:
    if cpus is None:  # this role has no list while another has: float, one thread
        return InstanceCpus(None, config.num_threads or 1)
    sharing = sum(1 for _, other in names_and_roles if config.cpus_of(other) == cpus)
    return InstanceCpus(cpus, config.num_threads or max(1, len(cpus) // sharing))


def _split(cpus: list[int], parts: int) -> list[list[int]]:
    """`cpus` in `parts` contiguous runs whose sizes differ by at most one (larger first)."""
    size, extra = divmod(len(cpus), parts)
    runs, start = [], 0
    for index in range(parts):
        stop = start + size + (1 if index < extra else 0)
        runs.append(cpus[start:stop])
        start = stop
    return runs
