# Every target that needs the host prepared calls scripts/bootstrap-host.sh first; it is quick
# when everything is already there, so `make run` and `make test` work on a fresh machine.
VENV   ?= .venv
PYTHON ?= python3
HOST   ?= 127.0.0.1
PORT   ?= 3000
BIN    := $(VENV)/bin
# What outlives a clone (downloaded wheels, client venvs, Agent Canvas, the Kubernetes binaries,
# mypy's cache), so that a fresh clone of a machine that ran the tests before starts warm.
export ACS_CACHE_DIR ?= $(HOME)/.cache/acs
export MYPY_CACHE_DIR ?= $(ACS_CACHE_DIR)/mypy
# Bytecode is cached: a shell that sets PYTHONDONTWRITEBYTECODE would otherwise make every
# pytest worker rewrite and compile every test module (about 10 s of CPU each) and every
# `controlplane` process the suite starts compile the project again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: all host browser install images image run test test-deep test-unit test-prep test-quick chaos ha lint format mypy bench bench-official bench-kube clean kube-binaries

all: lint test

host:
	@scripts/bootstrap-host.sh

# Debian's chromium, which the browser tests drive (tests/auth/test_sign_in_pages.py), and npm, which
# fetches the web apps they run (tests/support/agent_canvas.py).
browser:
	@scripts/bootstrap-host.sh --browser

$(BIN)/.installed: pyproject.toml
	@scripts/bootstrap-host.sh --python-only
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

install: $(BIN)/.installed

# Every enabled spec (and those ACS_ENABLE_SPECS names); SPECS="openhands ..." builds only those.
images: install host
	@scripts/build-images.sh $(SPECS)

# The control plane's own image (Dockerfile), acs-control-plane:latest; after `images`, which
# makes the base image and the sandbox images it starts (docs/deployment.md).
image: images
	@scripts/build-control-plane-image.sh

run: install host images
	$(BIN)/controlplane serve --host $(HOST) --port $(PORT)

# pytest-xdist workers for the tiers with Docker: most of a test's time is spent waiting on
# sandboxes, processes and time-outs, so more workers than cores pay (docs/development.md,
# "Parallel runs"); tests that share an expensive set-up run on one worker (tests/conftest.py).
TEST_WORKERS ?= 4
PARALLEL := -n $(TEST_WORKERS) --dist loadgroup

# Everything, slow tiers included (what CI runs), but the deep fuzz runs (`test-deep`).
test: install host images browser test-prep
	@scripts/run-suite.sh $(BIN) $(PARALLEL) -m "not deep"

# The long fuzz runs alone (marker `deep`): 10,000 hostile provider answers and schemathesis at
# 50 examples an operation, about 45 minutes; `make test` runs the same fuzzers at 1,000 answers
# and 10 examples (docs/development.md, "The fuzzer").
test-deep: install host images
	$(BIN)/pytest -m deep

# What the slow tiers need, made before pytest so that no test's time limit covers a build from
# nothing: the official agent server's image (minutes the first time, cached), the pinned
# OpenHands client venvs (tests/support/openhands_clients.py; their Python versions come from
# pyenv or PATH, which `bootstrap-host.sh --clients` reports and fills where it can), Agent
# Canvas from npm (tests/support/agent_canvas.py) and the OpenID provider
# (tests/support/oidc_provider.py), all cached under the data dir, the Kubernetes test cluster's
# binaries, and the control plane's own image (its wheels and venv take minutes the first time;
# tests/support/control_plane_image.py then finds docker's layer cache).
test-prep: install host images image browser kube-binaries
	@scripts/build-images.sh openhands
	@scripts/bootstrap-host.sh --clients
	$(BIN)/python -m tests.support.openhands_clients
	$(BIN)/python -m tests.support.agent_canvas
	$(BIN)/python -m tests.support.oidc_provider

# Everything that needs no more than redis-server: tests that use a Docker fixture or drive
# Chromium are marked by tests/conftest.py and left out, as are the slow tiers. On 4 workers
# (UNIT_WORKERS; 0: one process): a worker's collection now costs about 4 CPU-s with bytecode
# cached, and half of this tier's time is waiting (servers' starts, intervals, time-outs), which
# a fourth worker overlaps: 76 s of pytest against 96 s on 3, quiet host (docs/development.md,
# "Measured"); 5 were slower.
UNIT_WORKERS ?= 4
test-unit: install
	@scripts/bootstrap-host.sh --unit
	$(BIN)/pytest -n $(UNIT_WORKERS) --dist loadgroup -m "not docker and not browser and not slow"

# The Kubernetes test cluster's binaries (docs/test-cluster.md), built from Debian's source package
# the first time (about 10 minutes on 2 cores) and cached outside the clone
# (ACS_KUBE_CACHE, default ~/.cache/acs/kubernetes), where a fresh clone finds them again.
kube-binaries:
	@scripts/bootstrap-host.sh --kube
	@scripts/kube/build.sh >/dev/null

# Without the slow tiers (tests marked `slow`: real clients, chaos, the official agent server).
test-quick: install host images browser
	$(BIN)/pytest $(PARALLEL) -m "not slow"

# Fault injection alone: kill -9 of the control plane and of Redis under load (`make test` runs
# these too).
chaos: install host images
	$(BIN)/pytest -m chaos

# High availability alone: Redis Sentinel failovers, replicas behind haproxy, the sandbox proxy
# (`make test` runs these too).
ha: install host images
	$(BIN)/pytest -m ha

# ruff, ruff format, mypy strict (the tests too), and the layer contract (import-linter,
# pyproject.toml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy controlplane drivers agent bench tests
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

mypy: install
	$(BIN)/mypy controlplane drivers agent bench tests

bench: install host images
	$(BIN)/python -m bench.sandboxes
	$(BIN)/python -m bench.conversations
	$(BIN)/python -m bench.unauthenticated_flood
	$(BIN)/python -m bench.launch_load
	$(BIN)/python -m bench.warm_pool
	$(BIN)/python -m bench.llm_gateway
	$(BIN)/python -m bench.ha
	$(BIN)/python -m bench.oidc_sessions

# The official agent server's start latency (bench/official_agent.py); builds its image first
# (minutes from nothing), which `make bench` does not need. The benches run as modules of the
# repository (bench/common.py is their library; they import the test helpers of tests/support).
bench-official: install host images
	@scripts/build-images.sh openhands
	$(BIN)/python -m bench.official_agent

# The Kubernetes driver against raw pod operations (bench/kube_sandboxes.py), on the project's
# test cluster, which it brings up and takes down (root, cached binaries).
bench-kube: install host images kube-binaries
	$(BIN)/python -m bench.kube_sandboxes

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
