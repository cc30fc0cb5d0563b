# pdserve developer entry points. Every target works on a fresh machine: `setup` runs first
# and is a no-op (well under a second) once done.
SHELL := /bin/bash
.DEFAULT_GOAL := help

export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

PYTHON := .venv/bin/python
PDSERVE := .venv/bin/pdserve
PYTEST_FLAGS ?= -q -ra --durations=10
# `make test` runs two pytest processes side by side (scripts/test_lanes.sh): the unit tests
# with these end-to-end modules (each starts what it needs), and the other end-to-end modules
# (the shared and fault stacks). PDSERVE_TEST_LANES=1 runs them in one process.
E2E_BESIDE_UNIT := test_deterministic_stack test_engine_vs_transformers test_spec_decode test_default_model \
	test_disaggregated_parallel test_parallel_smollm2
TEST_LANE_1 := $(wildcard tests/unit) $(wildcard $(E2E_BESIDE_UNIT:%=tests/e2e/%.py))
TEST_LANE_2 := $(if $(wildcard tests/e2e),tests/e2e $(E2E_BESIDE_UNIT:%=--ignore=tests/e2e/%.py))
DEMO_PROMPT ?= Explain in two sentences why the sky is blue.
BENCH_ARGS ?=
# `make run` flags for `pdserve up` (e.g. UP_ARGS="--num-prefill 2 --num-decode 2").
UP_ARGS ?=
GATEWAY_PORT ?= 50051
SOAK_MINUTES ?= 30
CHAOS_MINUTES ?= 5
# `make image` / `make test-compose`: the image's tag, and flags for the compose scenario.
IMAGE ?= pdserve:latest
COMPOSE_ARGS ?=

# Tests never depend on `proto`: the drift test checks the committed stubs, and
# regenerating them before testing would hide drift.
# Runs pytest on lane 1's paths and, when given, lane 2's beside it; exit 5 ("no tests
# collected") is reported, not failed.
RUN_TESTS := bash scripts/test_lanes.sh "$(PYTHON)" "$(PYTEST_FLAGS)"

.PHONY: help setup test test-unit test-e2e image test-compose run demo bench bench-vllm-serve bench-saturation bench-offline bench-step-overhead bench-attention bench-transfer bench-guided bench-spec bench-lora bench-faults bench-multiturn bench-hol bench-autoscale bench-sim-validate bench-soak bench-chaos bench-tracing gpu-check convert proto clean

help:
	@echo "make setup          install everything (venv, deps, model, redis-server, docker-compose)"
	@echo "make test           all tests: unit first, then e2e"
	@echo "make test-unit      fast unit tests only"
	@echo "make test-e2e       end-to-end tests with the real SmolLM2 model"
	@echo "make image          the container image $(IMAGE) from a local Debian base (installs and starts Docker)"
	@echo "make test-compose   the compose stack in containers: scale, kill, stop, rolling upgrade (COMPOSE_ARGS=...)"
	@echo "make run            local stack: redis + prefill + decode + gateway on 127.0.0.1:$(GATEWAY_PORT) (UP_ARGS=...)"
	@echo "make demo           generate with the offline engine (no services)"
	@echo "make bench          serving: colocated vs disaggregated stack, request-rate sweep (BENCH_ARGS=...)"
	@echo "make bench-vllm-serve pdserve (make run's layout) vs vllm serve, same workload, back to back (BENCH_ARGS=..., PDSERVE_VLLM_PYTHON)"
	@echo "make bench-saturation 128 and 512 streaming chats sent at once, pdserve vs vllm serve in interleaved rounds (BENCH_ARGS=..., PDSERVE_VLLM_PYTHON)"
	@echo "make bench-offline  offline throughput vs transformers; BENCH_ARGS=--beside-hog, --compare-deterministic, --vllm-python PY"
	@echo "make bench-step-overhead an engine step split: schedule, inputs, forward, sampling, update, detokenize (BENCH_ARGS=...)"
	@echo "make bench-attention the C++ attention kernel: decode GB/s vs streaming, prompt rows (BENCH_ARGS=--baseline-source F)"
	@echo "make bench-transfer KV transfer microbenchmark over UCX (BENCH_ARGS=...)"
	@echo "make bench-guided   guided decoding: per-token mask cost, constrained vs free throughput (BENCH_ARGS=...)"
	@echo "make gpu-check      the CUDA path on an NVIDIA GPU: kernels, parity, throughput, bandwidth (BENCH_ARGS=...)"
	@echo "make bench-spec     speculative decoding: decode tok/s with and without, batch 1-64 (BENCH_ARGS=...)"
	@echo "make bench-lora     multi-LoRA: output tok/s with 1, 4 and 16 adapters mixed vs the base model, offline and served (+ vLLM with PDSERVE_VLLM_PYTHON) (BENCH_ARGS=...)"
	@echo "make bench-faults   kills, SIGTERMs and 20 s SIGSTOPs (and a KV holder killed mid-pull) under streaming load: ok/failed/migrated, recovery, p99, stranded blocks (BENCH_ARGS=..., --scenario TEXT)"
	@echo "make bench-multiturn multi-turn chats: pdserve with/without KV tiers vs vllm serve, TTFT per turn (BENCH_ARGS=..., PDSERVE_VLLM_PYTHON)"
	@echo "make bench-autoscale load ramp with --autoscale vs fixed 1P+1D, plots + simulator replay (BENCH_ARGS=...)"
	@echo "make bench-sim-validate the simulator vs the local 1P+1D stack at 3 Poisson rates (needs a quiet machine)"
	@echo "make bench-soak     soak: 1P+1D stack under a mixed load for SOAK_MINUTES (default 30), RSS and latency (BENCH_ARGS=...)"
	@echo "make bench-chaos    chaos: 2P+2D+2 gateways under Poisson load, a seeded fault every 30-90 s, for CHAOS_MINUTES (default 5); report + plot in bench-results/chaos/ (BENCH_ARGS=...)"
	@echo "make bench-tracing  the serving benchmark with tracing off, on (ratio 1.0) and on at 0.1, interleaved rounds (BENCH_ARGS=...)"
	@echo "make convert        convert the default GGUF model to a HF folder"
	@echo "make proto          regenerate gRPC stubs from proto/"
	@echo "make clean          remove caches and build outputs (keeps .venv)"

setup:
	@bash scripts/setup.sh

test: setup
	@$(RUN_TESTS) "$(TEST_LANE_1)" "$(TEST_LANE_2)"

test-unit: setup
	@$(RUN_TESTS) "$(wildcard tests/unit)" ""

test-e2e: setup
	@$(RUN_TESTS) "$(wildcard tests/e2e)" ""

# The service image, built here without any image registry (scripts/image.sh): Docker from
# Debian's packages, a Debian base made with debootstrap (once), pip configured as on this machine.
image: setup
	@bash scripts/image.sh build $(IMAGE)

# Not part of `make test` (it takes several minutes): the compose stack in containers on host
# networking, faults and a rolling upgrade under load; the summary goes to docs/compose/.
test-compose: image
	@bash scripts/image.sh redis
	$(PYTHON) -m tests.compose.scenario --image $(IMAGE) --out docs/compose $(COMPOSE_ARGS)

# The default SmolLM2 model, every service on loopback, Ctrl-C stops everything.
run: setup
	$(PDSERVE) --log-level INFO up --gateway-port $(GATEWAY_PORT) $(UP_ARGS)

demo: setup
	$(PDSERVE) offline --chat "$(DEMO_PROMPT)"

bench: setup
	$(PYTHON) -m benchmarks.serve_compare $(BENCH_ARGS)

bench-tracing: setup
	$(PYTHON) -m benchmarks.tracing_cost $(BENCH_ARGS)

bench-vllm-serve: setup
	$(PYTHON) -m benchmarks.serve_vs_vllm $(BENCH_ARGS)

bench-saturation: setup
	$(PYTHON) -m benchmarks.saturation $(BENCH_ARGS)

bench-offline: setup
	$(PYTHON) -m benchmarks.offline $(BENCH_ARGS)

bench-step-overhead: setup
	$(PYTHON) -m benchmarks.step_overhead $(BENCH_ARGS)

bench-attention: setup
	$(PYTHON) -m benchmarks.cpu_attention $(BENCH_ARGS)

bench-transfer: setup
	$(PYTHON) -m benchmarks.transfer $(BENCH_ARGS)

bench-guided: setup
	$(PYTHON) -m benchmarks.guided $(BENCH_ARGS)

bench-spec: setup
	$(PYTHON) -m benchmarks.spec_decode $(BENCH_ARGS)

bench-lora: setup
	$(PYTHON) -m benchmarks.lora $(BENCH_ARGS)

bench-faults: setup
	$(PYTHON) -m benchmarks.faults $(BENCH_ARGS)

bench-multiturn: setup
	$(PYTHON) -m benchmarks.multiturn $(BENCH_ARGS)

bench-hol: setup
	$(PYTHON) -m benchmarks.head_of_line $(BENCH_ARGS)

# On a machine with an NVIDIA GPU (no venv needed there): scripts/gpu_check.sh directly.
gpu-check:
	PYTHON=$(if $(wildcard $(PYTHON)),$(PYTHON),python3) scripts/gpu_check.sh $(BENCH_ARGS)

bench-soak: setup
	$(PYTHON) -m benchmarks.soak --minutes $(SOAK_MINUTES) $(BENCH_ARGS)

bench-chaos: setup
	$(PYTHON) -m benchmarks.chaos --duration-min $(CHAOS_MINUTES) $(BENCH_ARGS)

convert: setup
	$(PDSERVE) convert

proto: setup
	@if [[ -f scripts/gen_proto.py ]]; then $(PYTHON) scripts/gen_proto.py; \
	else echo "proto: scripts/gen_proto.py not present yet; nothing to generate"; fi

clean:
	find . -path ./.venv -prune -o -name __pycache__ -type d -print0 | xargs -0 rm -rf
	rm -rf .pytest_cache build *.egg-info bench-results

# Load ramp on the local stack, --autoscale against fixed 1P+1D (plots in bench-results/autoscale/).
bench-autoscale: setup
	$(PYTHON) -m benchmarks.autoscale --mode autoscale $(BENCH_ARGS)
	$(PYTHON) -m benchmarks.autoscale --mode fixed $(BENCH_ARGS)

# The simulator's validation: 1P+1D at 3 Poisson rates, then the simulator's replay (table + plot).
bench-sim-validate: setup
	$(PYTHON) -m benchmarks.sim_validate $(BENCH_ARGS)
	$(PYTHON) -m benchmarks.sim_validate_report --out bench-results/sim-validate
