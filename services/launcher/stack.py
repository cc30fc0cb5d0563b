"""LocalStack: start, watch and stop Redis + engine instances + a gateway as OS processes."""

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from services.launcher.child import ChildProcess, stop_children
from services.launcher.commands import child_env, gateway_argv, instance_argv
from services.launcher.config import StackConfig
from services.launcher.cpu_plan import InstanceCpus, cpus_for_new_instance, plan_instance_cpus
from services.launcher.errors import StackError
from services.launcher.ports import find_free_port
from services.launcher.readiness import grpc_address_of, wait_until_ready, wait_until_registered, wait_until_serving
from services.launcher.redis_child import RedisChild
from services.launcher.supervision_board import publish_records
from services.launcher.supervisor import Supervisor
from shared.model.cpu_budget import allowed_cpus, cpu_budget, omp_environment

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.2
BOARD_INTERVAL_S = 1.0


def _never() -> bool:
    return False


class LocalStack:
    """Usage: `with LocalStack(config) as stack: stack.start(); stack.supervise(stop_event)`.

    Scaling while supervised (any thread): `start_instances([(name, role)], deadline)` adds
    instances, `remove_instance(name)` drains one away."""

    def __init__(self, config: StackConfig):
        self.config = config
        self.run_dir = Path(config.run_dir or tempfile.mkdtemp(prefix="pdserve-stack-"))
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "ready").mkdir(parents=True, exist_ok=True)
        self.redis: RedisChild | None = None
        self.instances: list[ChildProcess] = []
        # Instances started so far (restarts excluded): the next one's index, never reused.
        self.num_instances_started = 0
        self.gateway: ChildProcess | None = None
        # Ready-file JSON and bound gRPC address of every service child, by name.
        self.ready_info: dict[str, dict] = {}
        self.addresses: dict[str, str] = {}
        self.supervisor = Supervisor(config.restart_policy, self.restart_child)
        # CPUs and threads of the first instances: disjoint cores where there are enough.
        self.available_cpus = allowed_cpus()[:cpu_budget()]  # a cgroup quota below the mask caps it
        self.cpu_plan = plan_instance_cpus(config, config.instance_roles(), self.available_cpus)

    # ---- starting ------------------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        if self.config.redis_url:
            return self.config.redis_url
        if self.redis is None:
            raise StackError("redis-server is not started yet")
        return self.redis.url

    @property
    def gateway_address(self) -> str:
        return self.addresses["gateway"]

    def start(self, should_abort: Callable[[], bool] = _never) -> None:
        """Start Redis, then the instances and the gateway side by side (the gateway loads its
        tokenizer while the instances load the model); return once every instance is SERVING
        and registered in Redis and the gateway SERVING, so that the gateway's first listing,
        made by the first request, has every instance. On failure stop all."""
        deadline = time.monotonic() + self.config.ready_timeout_s
        try:
            self._start_redis(should_abort)
            instances = self._spawn_instances(self.config.instance_roles())
            self._spawn_gateway()
            self._await_instances(instances, deadline, should_abort)
            self._await_serving(self.gateway, deadline, should_abort)
        except BaseException:
            self.stop()
            raise

    def _start_redis(self, should_abort: Callable[[], bool]) -> None:
        if self.config.redis_url:
            return
        port = self.config.redis_port or find_free_port(self.config.host)
        self.redis = RedisChild(port, self.run_dir, self.config.host, cpus=self.config.cpus_of("redis"))
        self.redis.start()
        self.redis.wait_ready(should_abort=should_abort)

    def start_instances(self, names_and_roles: list[tuple[str, str]], deadline: float,
                        should_abort: Callable[[], bool] = _never) -> list[ChildProcess]:
        """Launch these instances together, then wait until each one is SERVING and registered."""
        children = self._spawn_instances(names_and_roles)
        self._await_instances(children, deadline, should_abort)
        return children

    def _spawn_instances(self, names_and_roles: list[tuple[str, str]]) -> list[ChildProcess]:
        children = []
        for name, role in names_and_roles:
            ready_file = self._ready_file(name)
            placement = self._placement(name, role, len(self.instances) + len(names_and_roles))
            argv = instance_argv(self.config, name, role, self.redis_url, ready_file, placement.num_threads,
                                 self.num_instances_started)
            self.num_instances_started += 1
            children.append(self._spawn(name, role, argv, ready_file, placement))
        self.instances.extend(children)
        return children

    def _await_instances(self, children: list[ChildProcess], deadline: float,
                         should_abort: Callable[[], bool]) -> None:
        for child in children:
            self._await_serving(child, deadline, should_abort)
        for child in children:
            wait_until_registered(child, self.ready_info[child.name], self.redis_url, deadline, should_abort)

    def remove_instance(self, name: str, grace_s: float | None = None) -> ChildProcess:
        """Scale in: SIGTERM one instance (it drains), wait for its exit, stop supervising it."""
        child = next(child for child in self.instances if child.name == name)
        stop_children([child], self.config.stop_grace_s if grace_s is None else grace_s)
        self.instances = [other for other in self.instances if other is not child]
        self.supervisor.forget(name)
        return child

    def restart_child(self, child: ChildProcess) -> None:
        """Start a dead child again with the same command line; wait until it serves."""
        should_abort = self.supervisor.is_stopping
        if child is self.redis:
            self.redis.start()
            self.redis.wait_ready(should_abort=should_abort)
            return
        child.start()
        self._await_serving(child, time.monotonic() + self.config.ready_timeout_s, should_abort)

    def _spawn_gateway(self) -> None:
        ready_file = self._ready_file("gateway")
        argv = gateway_argv(self.config, self.redis_url, ready_file)
        self.gateway = self._spawn("gateway", "gateway", argv, ready_file)

    def start_extra_gateway(self, name: str, extra_args: Sequence[str] = ()) -> ChildProcess:
        """Another gateway on the same Redis, on ephemeral ports, with `extra_args` after the
        configured gateway flags; SERVING when this returns. Its caller supervises and stops it."""
        ready_file = self._ready_file(name)
        argv = [*gateway_argv(self.config, self.redis_url, ready_file), "--port", "0", "--http-port", "0",
                *extra_args]
        child = self._spawn(name, "gateway", argv, ready_file)
        try:
            self._await_serving(child, time.monotonic() + self.config.ready_timeout_s, _never)
        except BaseException:
            stop_children([child], self.config.stop_grace_s)
            raise
        return child

    def _ready_file(self, name: str) -> Path:
        return self.run_dir / "ready" / f"{name}.json"

    def _placement(self, name: str, role: str, num_instances: int) -> InstanceCpus:
        placement = self.cpu_plan.get(name)
        if placement is None:
            placement = cpus_for_new_instance(self.config, role, num_instances, self.available_cpus)
        return placement

    def _spawn(self, name: str, role: str, argv: list[str], ready_file: Path,
               placement: InstanceCpus | None = None) -> ChildProcess:
        """Start a child; an instance gets its planned CPUs, thread count and wait policy."""
        log_path = self.run_dir / "logs" / f"{name}.log"
        env, cpus = child_env(self.config), self.config.cpus_of(role)
        if placement is not None:
            env.update(omp_environment(placement.num_threads, env))
            cpus = placement.cpus
        child = ChildProcess(name, role, argv, log_path, ready_file, env, cpus=cpus)
        child.start()
        return child

    def _await_serving(self, child: ChildProcess, deadline: float,
                       should_abort: Callable[[], bool]) -> None:
        ready = wait_until_ready(child, deadline, should_abort)
        address = grpc_address_of(ready, self.config.host)
        wait_until_serving(child, address, deadline, should_abort)
        self.ready_info[child.name] = ready
        self.addresses[child.name] = address
        logger.info("%s is SERVING at %s", child.name, address)

    # ---- watching and stopping -----------------------------------------------------------

    def children(self) -> list[ChildProcess]:
        """Every child, in start order."""
        redis = [self.redis] if self.redis is not None else []
        gateway = [self.gateway] if self.gateway is not None else []
        return redis + self.instances + gateway

    def find_dead_child(self) -> ChildProcess | None:
        """The first child that exited without being asked to, if any."""
        for child in self.children():
            if child.exit_code() is not None and not child.expected_exit:
                return child
        return None

    def watch(self, stop_event: threading.Event) -> ChildProcess | None:
        """Block until `stop_event` is set (returns None) or a child dies (returns it)."""
        while not stop_event.wait(WATCH_INTERVAL_S):
            dead = self.find_dead_child()
            if dead is not None:
                logger.error("%s (pid %s) exited unexpectedly with status %s; last log lines "
                             "(%s):\n%s", dead.name, dead.pid, dead.exit_code(), dead.log_path,
                             dead.log_tail())
                return dead
        return None

    def supervise(self, stop_event: threading.Event) -> None:
        """Block until `stop_event` is set, restarting children that die (see Supervisor) and
        publishing their restart counts to Redis for `pdserve status`."""
        published_at = 0.0
        while not stop_event.wait(WATCH_INTERVAL_S):
            self.supervisor.check(self.children())
            if time.monotonic() - published_at >= BOARD_INTERVAL_S:
                publish_records(self.redis_url, self.config.deployment, self.supervisor.records())
                published_at = time.monotonic()

    def stop(self) -> None:
        """Gateway first, then all instances together, then Redis (so instances deregister)."""
        grace_s = self.config.stop_grace_s
        self.supervisor.stop()
        if self.gateway is not None:
            stop_children([self.gateway], grace_s)
        stop_children(self.instances, grace_s)
        if self.redis is not None:
            stop_children([self.redis], grace_s)

    def __enter__(self) -> "LocalStack":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
