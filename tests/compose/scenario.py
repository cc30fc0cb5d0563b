"""`make test-compose`: the compose stack in real containers, driven as an operator would.

The shipped deploy/compose/docker-compose.yml with tests/compose/docker-compose.host.yml
(host networking, loopback only, ports picked here) runs Redis, a gateway, 2 prefill and 2
decode containers of the image `make image` built, then, each phase under greedy streaming
load from this process (gRPC, EOS ignored, a fixed number of tokens each):

  up and healthy; the OpenAI client (chat, streamed completion, guided JSON) and a gRPC client
  (the same greedy text); one request's trace, which every container exports to an OTLP
  receiver in this process (host networking), holding spans of the gateway, a prefill and a
  decode container and both engine cores; `up --scale decode=3`; `docker kill` of a streaming decode container
  (then `up` brings it back); a decode's process killed inside its container (the restart
  policy brings it back); `docker kill` of Redis (then `up`); `docker stop` of a prefill
  container (SIGTERM: it drains; then `docker start`); `up --scale prefill=1`; a rolling
  upgrade to a new build tag (one container at a time: a new one healthy, then the old one
  stopped); the gateway recreated on the new tag; the planner in a container scaling the
  decode pool out and in through the Docker API; the colocated role; `stop` and `down`.

Per phase: requests, lost (failed or short; target 0), streams migrated, KV blocks still held
once the load ended (target 0), and timings. Prints the table, writes summary.md and
summary.json to --out, and exits 1 if a target was missed or a step failed.
"""

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import grpc  # noqa: E402
import openai  # noqa: E402

from shared.cluster.keys import ClusterNamespace  # noqa: E402
from services.planner.docker_engine import DockerEngineError  # noqa: E402
from shared.pb.pdserve.v1 import gateway_pb2_grpc  # noqa: E402
from tests.compose import compose_cli as cli  # noqa: E402
from tests.compose.cluster import ClusterView  # noqa: E402
from tests.compose.load import LoadUntilStopped, lost  # noqa: E402
from tests.helpers.gateway_client import generate, generate_request, random_token_ids  # noqa: E402
from tests.helpers.otlp_collector import CollectedSpan, OtlpCollector  # noqa: E402

MODEL_NAME = "SmolLM2-135M-Instruct"
REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 900.0
# The stop_grace_period of the prefill and decode services in deploy/compose/docker-compose.yml.
INSTANCE_STOP_GRACE_S = 150
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "country": {"type": "string", "maxLength": 20}},
        "required": ["city", "country"]}


@dataclass
class PhaseResult:
    name: str
    requests: int = 0
    lost: int = 0
    migrated: int = 0
    stranded_blocks: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)


class StepFailed(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return probe_socket.getsockname()[1]


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.5) -> float:
    """Seconds until `predicate()` held; StepFailed naming `what` after `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(interval_s)
    raise StepFailed(f"timed out after {timeout_s:.0f} s waiting for {what}")


class Scenario:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.image = args.image
        self.ports = {name: free_port() for name in ("redis", "gateway", "http", "planner")}
        self.collector = OtlpCollector()  # on the host's loopback, which the containers share
        self.project = cli.ComposeProject(args.project, {
            "PDSERVE_IMAGE": args.image, "TEST_REDIS_IMAGE": args.redis_image, "TEST_PROJECT": args.project,
            "TEST_REDIS_PORT": str(self.ports["redis"]), "TEST_GATEWAY_PORT": str(self.ports["gateway"]),
            "TEST_HTTP_PORT": str(self.ports["http"]), "TEST_PLANNER_PORT": str(self.ports["planner"]),
            "TEST_OTLP_ENDPOINT": self.collector.endpoint})
        self.scale = {"prefill": 2, "decode": 2}
        self.http = f"127.0.0.1:{self.ports['http']}"
        self.cluster = ClusterView(f"redis://127.0.0.1:{self.ports['redis']}/0",
                                   ClusterNamespace("default", MODEL_NAME), self.http)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.ports['gateway']}")
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)
        self.results: list[PhaseResult] = []
        self.facts: dict[str, object] = {}

    # ---- state ------------------------------------------------------------------------------

    def is_ready(self) -> bool:
        """Every expected container running and healthy, each instance registered."""
        for service, count in {"redis": 1, "gateway": 1, **self.scale}.items():
            containers = self.project.running(service)
            if len(containers) != count or any(c.health != "healthy" for c in containers):
                return False
        return self.cluster.counts() == self.scale

    def wait_ready(self, what: str) -> float:
        return wait_until(self.is_ready, READY_TIMEOUT_S, f"{what}: {self.scale} healthy and registered", 1.0)

    def up(self, **variables: str) -> float:
        started = time.monotonic()
        self.project.up(scale=self.scale, **variables)
        return time.monotonic() - started

    def busiest(self, service: str) -> cli.Container:
        """The service's container with the most requests running now (by its instance status)."""
        def running_requests(container: cli.Container) -> int:
            ready = cli.ready_info(container)
            status = self.cluster.status(ready["grpc_address"]) if ready else None
            return status.num_running if status is not None else -1
        return max(self.project.running(service), key=running_requests)

    # ---- load -------------------------------------------------------------------------------

    @contextmanager
    def under_load(self, result: PhaseResult, seed: int):
        """Streaming load for the phase; counts what it lost, what migrated, blocks left held."""
        migrated_before = self.cluster.gateway_counter("pdserve:migrations_total")
        load = LoadUntilStopped(self.stub, self.args.concurrency, prompt_tokens=(60, 160),
                                max_tokens=self.args.max_tokens, seed=seed, timeout_s=600)
        with load:
            load.wait_in_flight(min(2, self.args.concurrency), timeout_s=300)
            yield load
            finished = load.num_finished()
            # A few more requests after the event, so every instance now in the pool serves some.
            wait_until(lambda: load.num_finished() >= finished + self.args.concurrency, 300, "more requests")
            results = load.stop()
        failed = lost(results, self.args.max_tokens)
        result.requests, result.lost = len(results), len(failed)
        result.notes += [f"lost #{r.index}: {r.error or 'short'} after {len(r.token_ids)} tokens" for r in failed[:3]]
        result.migrated = self.cluster.gateway_counter("pdserve:migrations_total") - migrated_before
        result.stranded_blocks = self.cluster.wait_blocks_free()

    # ---- phases -----------------------------------------------------------------------------

    def phase_up(self, result: PhaseResult) -> None:
        started = time.monotonic()
        self.up()
        self.wait_ready("up")
        result.seconds["up_to_ready"] = time.monotonic() - started

    def phase_clients(self, result: PhaseResult) -> None:
        client = openai.OpenAI(base_url=f"http://{self.http}/v1", api_key="unused", max_retries=0, timeout=300)
        chat = client.chat.completions.create(model=MODEL_NAME, temperature=0, max_tokens=24, messages=[
            {"role": "user", "content": "Why is the sky blue?"}])
        prompt = "The three primary colors are"
        stream = client.completions.create(model=MODEL_NAME, prompt=prompt, temperature=0, max_tokens=16, stream=True)
        streamed = "".join(choice.text for chunk in stream for choice in chunk.choices)
        grpc_text = generate(self.stub, generate_request(text=prompt, max_tokens=16)).text
        guided = client.chat.completions.create(
            model=MODEL_NAME, temperature=0, max_tokens=60,
            messages=[{"role": "user", "content": "The capital of France as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}})
        city = json.loads(guided.choices[0].message.content)
        result.requests = 4
        result.notes.append(f"chat: {chat.choices[0].message.content[:60]!r}")
        result.notes.append(f"guided JSON: {city}")
        if not chat.choices[0].message.content:
            result.misses.append("empty chat answer")
        if streamed != grpc_text or not streamed:
            result.misses.append(f"OpenAI stream {streamed!r} != gRPC {grpc_text!r}")
        if set(city) != {"city", "country"}:
            result.misses.append(f"guided JSON {city} lacks the schema's keys")
        self.check_json_logs(result)

    def phase_trace(self, result: PhaseResult) -> None:
        """One request under the client's traceparent: its trace holds spans of the gateway, a
        prefill and a decode container and both their engine-core processes."""
        trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
        request = generate_request(token_ids=random_token_ids(120, seed=27), max_tokens=8, ignore_eos=True)
        call = self.stub.Generate(request, timeout=300, metadata=(("traceparent", f"00-{trace_id}-{span_id}-01"),))
        num_tokens = sum(len(message.token_ids) for message in call)
        result.requests = 1
        if num_tokens != 8 or dict(call.trailing_metadata()).get("x-trace-id") != trace_id:
            result.misses.append(f"{num_tokens} tokens, x-trace-id {dict(call.trailing_metadata()).get('x-trace-id')}")
        spans = self.collector.wait_for(trace_id, is_whole_trace, timeout_s=120)
        by_service = {}
        for span in spans:
            by_service.setdefault(span.service_name, set()).add(str(span.resource.get("service.instance.id", "?")))
        result.notes.append(f"trace {trace_id}: {len(spans)} spans; " + "; ".join(
            f"{service} {sorted(ids)}" for service, ids in sorted(by_service.items())))

    def check_json_logs(self, result: PhaseResult) -> None:
        for container in self.project.containers():
            if container.service == "redis":
                continue
            lines = [line for line in cli.logs(container, tail=200).splitlines() if line.strip()]
            bad = [line for line in lines if not is_json_object(line)]
            if bad or not lines:
                result.misses.append(f"{container.name}: {len(bad)} of {len(lines)} log lines not JSON: {bad[:1]}")

    def phase_scale_decode_out(self, result: PhaseResult) -> None:
        with self.under_load(result, seed=3):
            self.scale["decode"] = 3
            started = time.monotonic()
            self.up()
            self.wait_ready("scale-out")
            result.seconds["up_to_serving"] = time.monotonic() - started

    def phase_docker_kill_decode(self, result: PhaseResult) -> None:
        with self.under_load(result, seed=4) as load:
            victim = self.busiest("decode")
            cli.kill(victim)
            killed = time.monotonic()
            finished = load.num_finished()
            wait_until(lambda: load.num_finished() >= finished + self.args.concurrency, 300,
                       "requests served without the killed container")
            result.notes.append(f"killed {victim.name}; restarts {cli.inspect(victim.id).restart_count} "
                                f"(docker kill is an operator's stop: no restart)")
            started = time.monotonic()
            self.up()
            self.wait_ready("decode back after up")
            result.seconds["up_to_serving"] = time.monotonic() - started
            result.seconds["kill_to_serving"] = time.monotonic() - killed

    def phase_decode_crash(self, result: PhaseResult) -> None:
        with self.under_load(result, seed=5):
            victim = self.busiest("decode")
            subprocess.run(["kill", "-9", str(cli.main_pid(victim))], check=True)
            crashed = time.monotonic()
            wait_until(lambda: cli.inspect(victim.id).restart_count > victim.restart_count, 120,
                       "the restart policy to restart the crashed decode")
            self.wait_ready("crashed decode back")
            result.seconds["crash_to_serving"] = time.monotonic() - crashed

    def phase_docker_kill_redis(self, result: PhaseResult) -> None:
        with self.under_load(result, seed=6):
            [redis_container] = self.project.running("redis")
            cli.kill(redis_container)
            killed = time.monotonic()
            self.up()
            result.seconds["up_done"] = time.monotonic() - killed
            self.wait_ready("every instance registered again")
            result.seconds["kill_to_all_registered"] = time.monotonic() - killed

    def phase_docker_stop_prefill(self, result: PhaseResult) -> None:
        with self.under_load(result, seed=7):
            victim = self.busiest("prefill")
            result.seconds["docker_stop_drain"] = cli.stop(victim)
            exit_code = cli.inspect(victim.id).exit_code
            result.notes.append(f"{victim.name} exited {exit_code}; {shutdown_timeline(cli.logs(victim, tail=400))}")
            if exit_code != 0:
                result.misses.append(f"{victim.name} exited {exit_code} (killed before its drain ended?)")
            started = time.monotonic()
            cli.start(victim)
            self.wait_ready("stopped prefill started again")
            result.seconds["start_to_serving"] = time.monotonic() - started

    def phase_scale_prefill_in(self, result: PhaseResult) -> None:
        with self.under_load(result, seed=8):
            self.scale["prefill"] = 1
            result.seconds["up_scale_in"] = self.up()
            self.wait_ready("prefill pool of 1")

    def phase_rolling_upgrade(self, result: PhaseResult) -> None:
        new_image = f"{self.image.rsplit(':', 1)[0]}:compose-test-upgrade"
        started = time.monotonic()
        subprocess.run(["bash", str(REPO_ROOT / "scripts" / "image.sh"), "build", new_image,
                        f"upgrade-{int(time.time())}"], check=True)
        result.seconds["build_new_tag"] = time.monotonic() - started
        with self.under_load(result, seed=9):
            started = time.monotonic()
            for service in ("prefill", "decode"):
                self.roll(service, new_image)
            result.seconds["upgrade_prefill_and_decode"] = time.monotonic() - started
        self.project.env["PDSERVE_IMAGE"] = new_image
        stale = [c.name for c in self.project.containers() if c.service in self.scale and c.image != new_image]
        if stale:
            result.misses.append(f"still on the old image: {stale}")
        started = time.monotonic()
        self.project.up("gateway", no_recreate=False, no_deps=True)
        self.wait_ready("the new gateway")
        result.seconds["gateway_recreated_to_serving"] = time.monotonic() - started
        result.notes.append(f"{new_image}: {sum(self.scale.values())} instance containers replaced one at a "
                            "time, then the gateway (no load: one gateway port cannot overlap its successor)")

    def roll(self, service: str, new_image: str) -> None:
        """Replace each old container: one more on the new image, healthy and registered, then
        the old one stopped (it drains) and removed."""
        for old in [c for c in self.project.running(service) if c.image != new_image]:
            count = self.scale[service]
            self.scale[service] = count + 1
            self.project.up(service, scale={service: count + 1}, no_deps=True, PDSERVE_IMAGE=new_image)
            self.wait_ready(f"a new {service} on {new_image}")
            cli.stop(old)
            cli.remove(old)
            self.scale[service] = count
            self.wait_ready(f"{service} pool after removing {old.name}")

    def phase_planner(self, result: PhaseResult) -> None:
        bounds = {"PDSERVE_PLANNER_MIN_PREFILL": "1", "PDSERVE_PLANNER_MAX_PREFILL": "1"}
        with self.under_load(result, seed=10):
            started = time.monotonic()
            self.scale["decode"] = 4
            self.project.compose("--profile", "autoscale", "up", "-d", "--no-build", "--no-deps", "planner",
                                 PDSERVE_PLANNER_MIN_DECODE="4", PDSERVE_PLANNER_MAX_DECODE="4", **bounds)
            self.wait_ready("the planner's scale-out")
            result.seconds["scale_out_to_serving"] = time.monotonic() - started
            started = time.monotonic()
            self.scale["decode"] = 3
            self.project.compose("--profile", "autoscale", "up", "-d", "--no-build", "--no-deps", "planner",
                                 PDSERVE_PLANNER_MIN_DECODE="1", PDSERVE_PLANNER_MAX_DECODE="3", **bounds)
            self.wait_ready("the planner's scale-in")
            result.seconds["scale_in_done"] = time.monotonic() - started
        self.project.compose("--profile", "autoscale", "stop", "planner")
        result.notes.append("planner container (Docker actuator): decode 3 -> 4 -> 3")

    def phase_colocated(self, result: PhaseResult) -> None:
        name = f"{self.args.project}-colocated"
        env = {"PDSERVE_REDIS_URL": self.cluster.redis_url, "PDSERVE_DEPLOYMENT": "colocated-check",
               "PDSERVE_HOST": "127.0.0.1", "PDSERVE_ADVERTISE_HOST": "127.0.0.1", "PDSERVE_UCX_HOST": "127.0.0.1",
               "PDSERVE_GRPC_PORT": "0", "PDSERVE_NUM_THREADS": "1", "PDSERVE_KV_CACHE_MEMORY_GB": "0.25",
               "PDSERVE_LOG_FORMAT": "json"}
        # Docker's default 10 s stop timeout is shorter than the instance's drain (20 s): give it
        # the instances' compose stop_grace_period, as a user running the role alone should.
        command = ["docker", "run", "-d", "--name", name, "--network", "host",
                   "--stop-timeout", str(INSTANCE_STOP_GRACE_S)]
        for key, value in env.items():
            command += ["-e", f"{key}={value}"]
        started = time.monotonic()
        container_id = cli.run([*command, self.project.env["PDSERVE_IMAGE"], "colocated"]).strip()
        container = cli.inspect(container_id)
        view = ClusterView(self.cluster.redis_url, ClusterNamespace("colocated-check", MODEL_NAME), self.http)
        try:
            wait_until(lambda: cli.probe(container) and len(view.registered("colocated")) == 1, READY_TIMEOUT_S,
                       "the colocated instance")
            result.seconds["start_to_serving"] = time.monotonic() - started
            result.seconds["docker_stop"] = cli.stop(container)
            exit_code = cli.inspect(container_id).exit_code
            if exit_code != 0:
                result.misses.append(f"colocated exited {exit_code}")
        finally:
            cli.remove(container)

    def phase_stop_and_down(self, result: PhaseResult) -> None:
        started = time.monotonic()
        self.project.compose("--profile", "autoscale", "stop", timeout_s=900)
        result.seconds["stop_all"] = time.monotonic() - started
        killed = [f"{c.name} exited {c.exit_code}" for c in self.project.containers(all_states=True)
                  if c.service != "redis" and c.exit_code != 0]
        result.misses += killed
        result.notes.append("every pdserve container exited 0 after draining" if not killed else "")
        started = time.monotonic()
        self.project.down()
        result.seconds["down"] = time.monotonic() - started

    # ---- the run ----------------------------------------------------------------------------

    PHASES = (
        ("up: redis, gateway, 2 prefill, 2 decode", "phase_up"),
        ("OpenAI + gRPC clients, JSON logs", "phase_clients"),
        ("one request's trace: gateway, prefill, decode, engine cores", "phase_trace"),
        ("up --scale decode=3 under load", "phase_scale_decode_out"),
        ("docker kill decode mid-stream, then up", "phase_docker_kill_decode"),
        ("decode process killed: restart policy", "phase_decode_crash"),
        ("docker kill redis mid-stream, then up", "phase_docker_kill_redis"),
        ("docker stop prefill (drain), then start", "phase_docker_stop_prefill"),
        ("up --scale prefill=1 under load", "phase_scale_prefill_in"),
        ("rolling upgrade to a new build tag", "phase_rolling_upgrade"),
        ("planner container scales decode (Docker API)", "phase_planner"),
        ("colocated role", "phase_colocated"),
        ("stop (drain) and down", "phase_stop_and_down"),
    )

    def run(self) -> bool:
        self.facts = {"image": self.image, "image_mb": cli.image_size_bytes(self.image) // 1_000_000,
                      "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      "load": f"{self.args.concurrency} greedy gRPC streams at a time, prompts of 60-160 tokens, "
                              f"{self.args.max_tokens} output tokens each"}
        print(f"compose scenario: project {self.args.project}, ports {self.ports}, OTLP receiver "
              f"{self.collector.endpoint}", flush=True)
        self.collector.__enter__()
        try:
            for title, method in self.PHASES:
                if self.args.phase and not any(text in title for text in self.args.phase) and method != "phase_up":
                    continue
                result = PhaseResult(title)
                self.results.append(result)
                print(f"-- {title}", flush=True)
                try:
                    getattr(self, method)(result)
                except (StepFailed, cli.CommandFailed, subprocess.CalledProcessError, grpc.RpcError,
                        openai.OpenAIError, AssertionError, DockerEngineError) as error:
                    result.misses.append(f"{type(error).__name__}: {error}")
                    self.dump_logs()
                    break
                except KeyboardInterrupt:
                    result.misses.append("interrupted")
                    break
                finally:
                    print("   " + format_row(result), flush=True)
        finally:
            self.channel.close()
            self.cleanup()
            self.collector.__exit__(None, None, None)
        return not any(result.misses for result in self.results)

    def dump_logs(self) -> None:
        for container in self.project.containers(all_states=True):
            print(f"---- {container.name} ({container.image}, health {container.health}, exit {container.exit_code}) "
                  f"last lines:\n{cli.logs(container, tail=15)}", flush=True)

    def cleanup(self) -> None:
        subprocess.run(["docker", "rm", "-f", f"{self.args.project}-colocated"], capture_output=True)
        if self.project.containers(all_states=True):
            try:
                self.project.down()
            except cli.CommandFailed as error:
                print(f"cleanup: {error}", file=sys.stderr)


TRACED_ROLES = ("pdserve-gateway", "pdserve-prefill", "pdserve-decode", "pdserve-engine-core")


def is_whole_trace(spans: list[CollectedSpan]) -> bool:
    """Spans of every service, an engine core of each pool, and the gateway's request span
    (which ends last) have arrived."""
    services = {span.service_name for span in spans}
    core_roles = {span.resource.get("pdserve.role") for span in spans if span.service_name == "pdserve-engine-core"}
    return (set(TRACED_ROLES) <= services and {"prefill", "decode"} <= core_roles
            and any(span.name == "gateway.request" for span in spans))


SHUTDOWN_STEPS = (("shutting down", "SIGTERM"), ("drained: no accepted work left", "accepted work done"),
                  ("drain timeout", "drain timeout, work handed back"), (" stopped", "stopped"))


def shutdown_timeline(log_text: str) -> str:
    """When the last shutdown's steps were logged, in seconds after its "shutting down"."""
    events = []
    for line in log_text.splitlines():
        if not is_json_object(line):
            continue
        entry = json.loads(line)
        for text, name in SHUTDOWN_STEPS:
            if text in entry.get("message", "") and entry.get("logger", "").startswith("services."):
                events = [] if name == "SIGTERM" else events
                events.append((name, datetime.fromisoformat(entry["ts"].replace("Z", "+00:00"))))
    if not events:
        return "no shutdown lines in its log"
    start = events[0][1]
    return ", ".join(f"{name} at {(at - start).total_seconds():.1f} s" for name, at in events)


def is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def format_row(result: PhaseResult) -> str:
    seconds = ", ".join(f"{key} {value:.1f}" for key, value in result.seconds.items())
    status = "ok" if not result.misses else "MISSED: " + "; ".join(result.misses)
    return (f"| {result.name} | {result.requests} | {result.lost} | {result.migrated} | {result.stranded_blocks} | "
            f"{seconds} | {status} |")


def summary_markdown(scenario: Scenario) -> str:
    facts = scenario.facts
    lines = [f"Run of `make test-compose` started {facts['started']} on image `{facts['image']}` "
             f"({facts['image_mb']} MB); load: {facts['load']}.", "",
             "| phase | requests | lost | migrated | blocks held after | seconds | targets |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [format_row(result) for result in scenario.results]
    notes = [f"- {result.name}: {note}" for result in scenario.results for note in result.notes if note]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default="pdserve:latest")
    parser.add_argument("--redis-image", default="pdserve-local/redis:bookworm")
    parser.add_argument("--project", default="pdserve-compose-test")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--phase", action="append", help="run only phases whose title contains this (and up)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/compose"), help="summary.md and .json here")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    for tag in (args.image, args.redis_image):
        if not cli.image_exists(tag):
            print(f"image {tag} is missing: `make image` builds it (the scenario never pulls)", file=sys.stderr)
            return 2
    scenario = Scenario(args)
    ok = scenario.run()
    args.out.mkdir(parents=True, exist_ok=True)
    markdown = summary_markdown(scenario)
    (args.out / "summary.md").write_text(markdown)
    (args.out / "summary.json").write_text(json.dumps(
        {"facts": scenario.facts, "phases": [asdict(result) for result in scenario.results]}, indent=1) + "\n")
    print("\n" + markdown)
    print(f"compose scenario: {'all targets met' if ok else 'TARGETS MISSED'}; summary in {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
