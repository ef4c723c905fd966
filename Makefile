# toolbus: `make run` starts a worker with the bundled defaults, `make test` runs every test.
# Both set up .venv first; both make sure a mosquitto binary exists.
# The first Python >= 3.11 on PATH (scripts/find-python), found before the virtualenv's
# bin goes first on PATH below; `make PYTHON=python3.12 ...` names one instead.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell scripts/find-python 2>/dev/null)
endif
VENV   := .venv
BIN    := $(VENV)/bin
# Two installs into the one .venv: `make run` needs only the worker (`pip install -e .`),
# `make test` and the other targets the development tools too (`.[dev]`). The dev stamp
# keeps its old name, so a .venv made before stays valid; installing it marks the run one.
STAMP     := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
VENV_PY   := $(BIN)/python
BROKER_PORT ?= 1883
# $(CURDIR), not $(abspath): abspath splits a path that holds a space, and a clone may live anywhere.
export PATH := $(CURDIR)/$(BIN):$(PATH)
PYTEST_ARGS ?=

.PHONY: FORCE lock dist python-info python-check bench-tracing bench-logging bench-normalize bench-flood bench-flood-victim bench-mcp-output bench-client bench-cold-start bench-progress bench-call-context bench-profile compose-check check-tree asyncapi-parser mcp-everything bench bench-nodelay run test test-quick lint format typecheck schemas check broker stop-broker clean mosquitto-binary mosquitto-clients redis-binary ejabberd-binary promtool grafana-sdk chromium-binary

# An ordinary editable install: the source root worker/ holds the package toolbus/ (a src
# layout), which mypy, pytest and editors read as the files they are. pip is not quiet on
# the long steps: a first install takes a while, and its lines show it moving.
$(VENV_PY):
	@scripts/ensure-python $(PYTHON)
	@echo "toolbus: making $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The worker alone, unless the dev install (a superset) is already there and up to date.
$(RUN_STAMP): pyproject.toml | $(VENV_PY)
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then :; else \
	  echo "toolbus: installing the worker and its dependencies into $(VENV)" \
	    "(about 110 MB; about a minute on a first run)"; \
	  echo "$(BIN)/pip install -e ."; \
	  $(BIN)/pip install -e . || exit 1; \
	fi
	@touch $(RUN_STAMP)

$(STAMP): pyproject.toml | $(VENV_PY)
	@echo "toolbus: installing the worker and the development tools (pytest, ruff, mypy," \
	  "the providers' SDKs) into $(VENV) (about 310 MB; a minute or two on a first run)"
	$(BIN)/pip install -e '.[dev]'
	@touch $(STAMP) $(RUN_STAMP)

# A PYTHON named on the command line (or in the environment) must exist, whether or not
# .venv does: one line saying so, not a shell's "not found" from deep in a recipe.
python-check:
	@$(if $(filter command line environment,$(origin PYTHON)),scripts/find-python --check '$(PYTHON)',:)

FORCE:

mosquitto-binary:
	@scripts/ensure-mosquitto

# The broker, and mosquitto_rr/mosquitto_sub: the tests run docs/integrations.md's commands.
mosquitto-clients:
	@scripts/ensure-mosquitto --clients

# The tests start their own redis-server (the shared dedup store) on a free port.
redis-binary:
	@scripts/ensure-redis

# ejabberd: an MQTT 5 broker without `$share` (tests/support/ejabberd.py starts its nodes).
ejabberd-binary:
	@scripts/ensure-ejabberd

# promtool and prometheus (Debian's `prometheus` package), which tests/project/test_alerts.py
# runs over compose/prometheus: the configuration, the alert rules and their unit tests,
# and the rules and the dashboard's queries over a real worker.
promtool:
	@scripts/ensure-promtool

# Grafana's dashboard schema (grafana-foundation-sdk, pinned in tools/grafana/requirements.txt),
# in a venv of its own, .tools/grafana-sdk: tests/project/test_dashboard.py checks
# compose/grafana/dashboards/*.json against it.
grafana-sdk:
	@scripts/ensure-grafana-sdk

# The status page's test renders it in a headless chromium (Debian's; nothing downloaded).
chromium-binary:
	@scripts/ensure-chromium

# The AsyncAPI project's parser, which tests/cli/test_asyncapi.py runs over docs/asyncapi.yaml:
# npm installs the versions tools/asyncapi/package-lock.json pins into .tools/asyncapi.
asyncapi-parser:
	@scripts/ensure-asyncapi

# The MCP project's reference server-everything (a third-party MCP server), which the
# acceptance tests run: npm installs tools/mcp-everything's pins into .tools/mcp-everything.
mcp-everything:
	@scripts/ensure-mcp-everything

# Starts a local broker on $(BROKER_PORT) unless something already listens there.
broker: mosquitto-binary
	@scripts/local-broker start $(BROKER_PORT)

stop-broker:
	@scripts/local-broker stop $(BROKER_PORT)

# Its first line says which Python the worker runs on. The worker talks to the broker on
# $(BROKER_PORT), unless TOOLBUS_BROKER_URL names another.
run: python-info $(RUN_STAMP) broker
	TOOLBUS_BROKER_URL="$${TOOLBUS_BROKER_URL:-mqtt://localhost:$(BROKER_PORT)}" $(BIN)/toolbus serve --config config/toolbus.toml

# The virtualenv's Python once it exists, else the one it will be made with.
python-info: python-check
	@scripts/find-python --say $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))

# A tracing backend for the end-to-end tracing test, in a venv of its own (its pins are its own).
# A stamp, not the phoenix binary, marks it done: an install cut short is redone, not trusted.
PHOENIX_VENV  := .venv-phoenix
PHOENIX_STAMP := $(PHOENIX_VENV)/.installed
$(PHOENIX_STAMP):
	$(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/pip install --quiet --upgrade pip
	@echo "toolbus: installing Arize Phoenix (a tracing backend for one test) into $(PHOENIX_VENV) (about a minute)"
	$(PHOENIX_VENV)/bin/pip install --progress-bar off 'arize-phoenix>=12,<30'
	@touch $(PHOENIX_STAMP)

# Node-RED, for the test that runs docs/integrations/node-red-flow.json in it: pinned, in
# a folder of its own (git-ignored), with npm. 4.x: Node-RED 5 needs Node.js 22.
NODE_RED_DIR     := .node-red
NODE_RED_STAMP   := $(NODE_RED_DIR)/.installed
NODE_RED_VERSION := 4.1.8
$(NODE_RED_STAMP):
	@scripts/ensure-node
	npm install --silent --no-audit --no-fund --prefix $(NODE_RED_DIR) node-red@$(NODE_RED_VERSION)
	@touch $(NODE_RED_STAMP)

# Every test, the `integration` ones (Phoenix, Node-RED) included. Extra pytest
# arguments: make test PYTEST_ARGS='-k normalize -x'
test: $(STAMP) mosquitto-clients redis-binary ejabberd-binary promtool grafana-sdk chromium-binary asyncapi-parser mcp-everything $(PHOENIX_STAMP) $(NODE_RED_STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# The quick loop: everything but the `integration` tests (no Phoenix or Node-RED install).
test-quick: $(STAMP) mosquitto-clients redis-binary ejabberd-binary promtool grafana-sdk chromium-binary asyncapi-parser mcp-everything
	$(BIN)/pytest -m "not integration" $(PYTEST_ARGS)

# What CI runs first: nothing tracked may point outside the tree or sit under an ignored path.
check-tree:
	@scripts/check-tree

lint: $(STAMP)
	$(BIN)/ruff check worker tests bench
	$(BIN)/ruff format --check worker tests bench

typecheck: $(STAMP)
	$(BIN)/mypy worker tests

# Rewrites in place what `lint` only checks: import order and the ruff layout.
format: $(STAMP)
	$(BIN)/ruff check --fix worker tests bench
	$(BIN)/ruff format worker tests bench

# schemas/*.json and docs/asyncapi.yaml, from the code.
schemas: $(STAMP)
	$(BIN)/toolbus schemas --write

compose-check:
	scripts/check-compose

# compose/requirements.lock, the image's pinned and hashed Python packages, renewed from
# pyproject.toml with pip-tools in a throwaway venv (scripts/lock-requirements says how):
# `make lock` keeps the pins that still fit, `make lock LOCK_ARGS=--upgrade` takes the newest.
LOCK_ARGS ?=
lock:
	scripts/lock-requirements $(LOCK_ARGS)

# The release's sdist and wheel in dist/ (docs/deployment.md: `pipx install` from the wheel).
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist

check: check-tree lint typecheck test compose-check

clean:
	rm -rf $(VENV) $(PHOENIX_VENV) $(NODE_RED_DIR) build dist worker/toolbus.egg-info .pytest_cache .mypy_cache .ruff_cache .run .tools

bench: $(STAMP) mosquitto-binary
	$(BIN)/toolbus bench

bench-tracing: $(STAMP) mosquitto-binary
	$(BIN)/toolbus bench --only toolbus-echo --tracing

bench-logging: $(STAMP) mosquitto-binary
	$(BIN)/toolbus bench --only toolbus-echo --logging

bench-normalize: $(STAMP)
	$(BIN)/python bench/normalize.py

bench-flood: $(STAMP) mosquitto-binary
	$(BIN)/python bench/flood.py --requests 100000

bench-flood-victim: $(STAMP) mosquitto-binary
	$(BIN)/python bench/flood_victim.py

bench-mcp-output: $(STAMP)
	$(BIN)/python bench/mcp_output.py

bench-client: $(STAMP) mosquitto-binary
	$(BIN)/python bench/client_latency.py

bench-cold-start: $(STAMP) mosquitto-binary
	$(BIN)/python bench/cold_start.py

# py-spy on the worker under the bench's load, per stage (bench/profile_stages.py).
bench-profile: $(STAMP) mosquitto-binary
	$(BIN)/pip install --quiet py-spy
	$(BIN)/python bench/profile_stages.py

bench-nodelay: $(STAMP) mosquitto-clients
	$(BIN)/python bench/tcp_nodelay.py

bench-progress: $(STAMP) mosquitto-binary
	$(BIN)/python bench/progress_tasks.py

bench-call-context: $(STAMP)
	$(BIN)/python bench/call_context.py
