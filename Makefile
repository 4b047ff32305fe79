# lockgate — every target does its own setup, idempotently.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
# The stack tests' autoscaled cluster (no node until Karpenter makes one; docs/autoscaling.md).
AUTOSCALED_CLUSTER := cluster-c

.PHONY: help venv browser stack-up stack-down stack-status stack-env lint unit integration test compose-test images demo run bench simulate fresh-check clean tilt compose-up compose-down

help:
	@echo "make demo          bring the local stack up, run every service and a fair-share demo"
	@echo "make run           the local stack and every service in the foreground, for you to use (Ctrl-C stops)"
	@echo "make test          lint, type-check, unit, integration and end-to-end tests (real stack)"
	@echo "make unit          fast unit tests only (no stack)"
	@echo "make compose-up    docker compose for you: engine, images, kubeconfigs, in-cluster webhooks"
	@echo "make compose-down  remove all that compose-up made"
	@echo "make compose-test  docker compose up (local images, docker-compose.local.yml) against the stack"
	@echo "make bench         benchmarks; JSON lines, last line a summary"
	@echo "make simulate      the fleet simulator: bench/scenarios/*.yaml through the real scheduler (SCALE=1 for the full fleet, SCENARIOS=file.yaml)"
	@echo "make fresh-check   clone HEAD, brand-new stack state, make demo + make test (BURN=2 adds CPU burners, REPEAT=2 runs the stack tests twice)"
	@echo "make stack-up|stack-down|stack-status|stack-env"

venv: $(INSTALLED)

$(INSTALLED): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "lockgate needs Python 3.11+, found " + sys.version' 
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -U pip
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $@

# The web UI's browser tests drive Debian's chromium with Playwright (pip, in the venv); never
# `playwright install`, which downloads a browser of its own and fails offline.
browser:
	@command -v chromium >/dev/null || { echo "installing Debian's chromium (browser tests)"; \
	  $(SUDO) apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q chromium >/dev/null; }; }
	@command -v chromium >/dev/null || { echo "chromium did not install: apt-get install chromium"; exit 1; }

stack-up: venv
	$(BIN)/python -m devstack up

stack-down: venv
	$(BIN)/python -m devstack down

stack-status: venv
	$(BIN)/python -m devstack status

stack-env: venv
	@$(BIN)/python -m devstack env

lint: venv
	$(BIN)/ruff check libs services tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: venv
	$(BIN)/pytest -q tests/unit

integration: venv browser stack-up
	$(BIN)/python -m devstack.karpenter >/dev/null
	$(BIN)/python -m devstack up --autoscaled $(AUTOSCALED_CLUSTER)
	$(BIN)/python -m devstack.kuberay >/dev/null
	$(BIN)/python -m devstack.clients >/dev/null
	$(BIN)/pytest -q tests/integration tests/e2e

# The e2e test of usage that decays spends 8 of its minutes waiting (a queue holds the cluster
# for the issue's 5 minutes, then the shares are followed for 3): it runs in the background
# beside the unit tests and the builds, on the stack's cluster-a, which nothing else uses until
# it ends; the other stack tests start after it. Its output is printed when it ends.
BESIDE_TESTS := tests/e2e/test_usage_decay_e2e.py

test: venv lint browser
	# Karpenter (cached by version) first: the stack's autoscaled cluster runs it.
	$(BIN)/python -m devstack.karpenter >/dev/null
	$(BIN)/python -m devstack up --autoscaled $(AUTOSCALED_CLUSTER)
	@beside_log=$$(mktemp /tmp/lockgate-beside.XXXXXX); \
	echo "$(BESIDE_TESTS) runs in the background (output: $$beside_log, printed when it ends)"; \
	$(BIN)/pytest -q --timeout=1200 -p no:cacheprovider $(BESIDE_TESTS) >"$$beside_log" 2>&1 & beside=$$!; \
	status=0; \
	{ $(BIN)/pytest -q tests/unit && \
	  $(BIN)/python -m devstack.tilt >/dev/null && \
	  $(BIN)/python -m devstack.jaeger --build >/dev/null && \
	  $(BIN)/python -m devstack.helm >/dev/null && \
	  $(BIN)/python -m devstack.fabric8 && \
	  $(BIN)/python -m devstack.kuberay >/dev/null && \
	  $(BIN)/python -m devstack.clients >/dev/null; } || status=$$?; \
	wait $$beside || status=$$?; \
	echo "--- $(BESIDE_TESTS), run beside:"; cat "$$beside_log"; rm -f "$$beside_log"; \
	[ $$status -eq 0 ] || exit $$status; \
	$(BIN)/pytest -q --timeout=600 --durations=60 --ignore=$(BESIDE_TESTS) tests/integration tests/e2e

# docker compose with locally built images against the local stack (tests/compose); starts a
# dockerd of its own if none runs, and stops it again. Timings: compose-test-timings.json.
compose-test: venv
	$(BIN)/python -m devstack up
	$(BIN)/pytest -q --timeout=2400 tests/compose
	@cat "$${LOCKGATE_CACHE_DIR:-$$HOME/.cache/lockgate}/logs/compose-test-timings.json" 2>/dev/null || true

# Tilt built once from the Go module proxy, and `tilt` in .venv/bin (docs/deploying.md).
tilt: venv
	$(BIN)/python -m devstack.tilt >/dev/null

# The compose path for a person: engine, images, kubeconfigs, compose and the in-cluster webhooks
# (pods in namespaces labelled lockgate.io/managed=true, lockgate.io/run=compose are gated).
compose-up: venv
	$(BIN)/python -m devstack up
	$(BIN)/python -m devstack.compose_up up

compose-down: venv
	$(BIN)/python -m devstack.compose_up down

images: venv
	$(BIN)/python -m devstack images

demo: venv
	$(BIN)/python -m devstack up --autoscaled cluster-c
	$(BIN)/python -m devstack.demo

run: venv
	$(BIN)/python -m devstack.dev $(RUN_ARGS)

bench: venv
	$(BIN)/python -m devstack up
	$(BIN)/python bench/run.py

simulate: venv
	$(BIN)/python bench/simulate.py $(if $(SCALE),--scale $(SCALE)) $(SCENARIOS)

fresh-check:
	.ci/fresh-check --burn $${BURN:-0} --repeat $${REPEAT:-1} $(FRESH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
