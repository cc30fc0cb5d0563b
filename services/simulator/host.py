"""The shared-host CPU model: instances that share one machine slow each other.

Each computation (a prefill, a decode step) is a job with a fixed amount of work, in seconds
it would take alone. While k jobs run at once on the host, each progresses at 1/slowdown(k)
of its speed alone (processor sharing):

    slowdown(1) = 1
    slowdown(k) = colocated_slowdown * max(1, k / cores)      for k >= 2

`colocated_slowdown` is what `pdserve profile` measured beside one busy neighbour (caches,
memory bandwidth, the service threads); beyond the host's cores the jobs also split the cores.
Whenever a job starts or ends the others' finish times change: `start` and `finish` return
the new (job id, finish time, version) of every running job, and an event carrying an older
version is stale.
"""

from dataclasses import dataclass


@dataclass
class _Job:
    remaining_s: float  # work left, in seconds alone
    version: int = 0


class SharedHost:
    def __init__(self, cores: int, colocated_slowdown: float):
        if cores < 1:
            raise ValueError(f"host_cores must be >= 1, got {cores}")
        if colocated_slowdown < 1.0:
            raise ValueError(f"colocated_slowdown must be >= 1, got {colocated_slowdown}")
        self.cores = cores
        self.colocated_slowdown = colocated_slowdown
        self._jobs: dict[int, _Job] = {}
        self._updated_at = 0.0

    def slowdown(self, num_jobs: int) -> float:
        if num_jobs <= 1:
            return 1.0
        return self.colocated_slowdown * max(1.0, num_jobs / self.cores)

    @property
    def num_running(self) -> int:
        return len(self._jobs)

    def is_current(self, job_id: int, version: int) -> bool:
        job = self._jobs.get(job_id)
        return job is not None and job.version == version

    def _advance(self, now: float) -> None:
        """Charge the work done since the last change at the old rate."""
        done = (now - self._updated_at) / self.slowdown(len(self._jobs))
        for job in self._jobs.values():
            job.remaining_s = max(0.0, job.remaining_s - done)
        self._updated_at = now

    def _finish_times(self, now: float) -> list[tuple[int, float, int]]:
        factor = self.slowdown(len(self._jobs))
        out = []
        for job_id, job in self._jobs.items():
            job.version += 1
            out.append((job_id, now + job.remaining_s * factor, job.version))
        return out

    def start(self, now: float, job_id: int, work_s: float) -> list[tuple[int, float, int]]:
        self._advance(now)
        self._jobs[job_id] = _Job(work_s)
        return self._finish_times(now)

    def finish(self, now: float, job_id: int) -> list[tuple[int, float, int]]:
        self._advance(now)
        del self._jobs[job_id]
        return self._finish_times(now)
