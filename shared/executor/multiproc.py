"""The executor that drives one worker process per tensor/pipeline-parallel rank.

Each step's SchedulerOutput goes out as a compact message (step_message.py) through a
shared-memory ring every worker reads; the output rank's reply comes back through a second
ring. While waiting the engine checks that every worker is alive and that the step ends within
`worker_step_timeout_s`: a dead or hung worker raises `WorkerFailedError` (the engine's
requests fail with that message), the remaining workers are killed, and the executor refuses
further steps. Workers are fresh interpreters running `python -m shared.executor.worker_main`
(never forked from a threaded engine, and never re-running the user's `__main__`, so `LLM(...)`
works in a script without a main guard); each reads its typed startup message on stdin.
"""

import atexit
import logging
import os
import subprocess
import time
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from shared.core.scheduler_output import SchedulerOutput
from shared.executor.base import Executor, ModelRunnerOutput
from shared.executor.kv_shards import SharedKVShards
from shared.executor.shm_ring import ShmRing
from shared.executor.step_message import StepEncoder, StepMessage, encode_step
from shared.executor.python_child import child_environment, module_command
from shared.executor.worker_reply import decode_reply
from shared.executor.worker_startup import AdapterSettings, CacheLayout, WorkerStartup, encode_startup
from shared.kv_cache.layout import KVCacheLayout
from shared.lora.config import LoRAConfig
from shared.parallel.config import ParallelConfig

logger = logging.getLogger(__name__)

WORKER_MODULE = "shared.executor.worker_main"
START_TIMEOUT_S = 600.0
SHUTDOWN_GRACE_S = 10.0


class WorkerFailedError(RuntimeError):
    """A worker process died or stopped answering; the engine cannot continue."""


class MultiProcExecutor(Executor):
    def __init__(self, model_folder: str, layout: KVCacheLayout, parallel: ParallelConfig,
                 num_threads: int | None = None, seed: int = 0, lora: LoRAConfig | None = None):
        self._layout = layout
        self._lora = lora
        self._resident_lora_ids: list[int] = []  # as the output rank last reported
        self.parallel = parallel
        self._encoder = StepEncoder()
        self._failure: str | None = None
        self._closed = False
        # Communication time the output rank reported, summed over steps (benchmarks read it).
        self.comm_seconds_total = 0.0
        self.num_steps = 0
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(minutes=5))
        self._receive_buffer: torch.Tensor | None = None
        self._workers: list[subprocess.Popen] = []
        self._steps: ShmRing | None = None
        self._replies: ShmRing | None = None
        self._kv_shards = SharedKVShards(layout, parallel.tensor_parallel_size, parallel.pipeline_parallel_size)
        atexit.register(self.shutdown)
        try:
            self._steps = ShmRing.create(num_readers=parallel.world_size)
            self._replies = ShmRing.create(num_readers=1)
            self._workers = self._spawn(model_folder, num_threads or 1, seed)
            self._await_reply(START_TIMEOUT_S, "start")
        except BaseException:
            self.shutdown()  # a failed start leaves no worker, ring or KV shard file behind
            raise

    def _spawn(self, model_folder: str, num_threads: int, seed: int) -> list[subprocess.Popen]:
        workers = []
        try:
            for rank in range(self.parallel.world_size):
                workers.append(_start_worker(WorkerStartup(
                    rank, self.parallel.tensor_parallel_size, self.parallel.pipeline_parallel_size, os.getpid(),
                    self._store.port, model_folder, CacheLayout.of(self._layout), self._kv_shards.folder,
                    num_threads, seed, self._steps.spec, self._replies.spec, AdapterSettings.of(self._lora))))
        except BaseException:
            for worker in workers:
                worker.kill()
                worker.wait()
            raise
        return workers

    @property
    def kv_cache_layout(self) -> KVCacheLayout:
        return self._layout

    def resident_lora_ids(self) -> list[int]:
        return list(self._resident_lora_ids)

    @property
    def worker_pids(self) -> list[int]:
        return [worker.pid for worker in self._workers]

    @property
    def kv_cache(self) -> torch.Tensor:
        """A full-layout buffer a KV receiver writes into (made on first use: decode role);
        `commit_received_blocks` then copies the blocks to the ranks' shards."""
        if self._receive_buffer is None:
            self._receive_buffer = self._layout.allocate()
        return self._receive_buffer

    def blocks_for_send(self, block_ids: list[int]) -> tuple[torch.Tensor, KVCacheLayout, list[int]]:
        gathered = self._kv_shards.gather(block_ids)
        return gathered, replace(self._layout, num_blocks=len(block_ids)), list(range(len(block_ids)))

    def commit_received_blocks(self, block_ids: list[int]) -> None:
        self._kv_shards.scatter(self.kv_cache, block_ids)

    @property
    def max_concurrent_batches(self) -> int:
        """Two batches in flight with pipeline stages: stage 0 starts the next batch while the
        later stages finish the previous one."""
        return 2 if self.parallel.pipeline_parallel_size > 1 else 1

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.submit_batch(scheduler_output)
        return self.collect_batch()

    def submit_batch(self, scheduler_output: SchedulerOutput) -> None:
        if self._failure is not None:
            raise WorkerFailedError(self._failure)
        deadline = time.monotonic() + self.parallel.worker_step_timeout_s
        payload = encode_step(self._encoder.encode(scheduler_output))
        try:
            self._steps.write(payload, lambda: self._check_workers(deadline, "step"))
        except WorkerFailedError:
            self._fail()
            raise

    def collect_batch(self) -> ModelRunnerOutput:
        if self._failure is not None:
            raise WorkerFailedError(self._failure)
        reply = self._await_reply(self.parallel.worker_step_timeout_s, "step")
        self.comm_seconds_total += reply.comm_seconds
        self.num_steps += 1
        self._resident_lora_ids = reply.resident_lora_ids
        return reply.output or ModelRunnerOutput()

    def _await_reply(self, timeout_s: float, what: str):
        deadline = time.monotonic() + timeout_s
        try:
            return decode_reply(self._replies.read(0, lambda: self._check_workers(deadline, what)))
        except WorkerFailedError:
            self._fail()
            raise

    def _check_workers(self, deadline: float, what: str) -> None:
        for rank, worker in enumerate(self._workers):
            if worker.poll() is not None:
                self._failure = (f"parallel worker rank {rank} exited with code {worker.returncode} "
                                 f"during {what}; the engine cannot continue")
                raise WorkerFailedError(self._failure)
        if time.monotonic() > deadline:
            self._failure = f"parallel workers gave no {what} result within the timeout; a worker hangs"
            raise WorkerFailedError(self._failure)

    def _fail(self) -> None:
        logger.error("%s", self._failure)
        self._stop_workers(graceful=False)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        if self._failure is None and any(worker.poll() is None for worker in self._workers):
            deadline = time.monotonic() + SHUTDOWN_GRACE_S
            try:
                self._steps.write(encode_step(StepMessage(shutdown=True)),
                                  lambda: self._check_workers(deadline, "shutdown"))
            except WorkerFailedError:
                pass
        self._stop_workers(graceful=self._failure is None)
        for ring in (self._steps, self._replies):
            if ring is not None:
                ring.close(unlink=True)
        self._kv_shards.close()

    def _stop_workers(self, graceful: bool) -> None:
        for worker in self._workers:
            try:
                worker.wait(timeout=SHUTDOWN_GRACE_S if graceful else 0.0)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


def _start_worker(startup: WorkerStartup) -> subprocess.Popen:
    """A worker process with its startup message on stdin (an early exit shows in its status)."""
    worker = subprocess.Popen(module_command(WORKER_MODULE), stdin=subprocess.PIPE, env=child_environment())
    try:
        worker.stdin.write(encode_startup(startup))
        worker.stdin.close()
    except BrokenPipeError:
        pass  # it exited already; the start check reports its exit code
    return worker
