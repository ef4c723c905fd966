# toolbus: `make run` starts a worker with the bundled defaults, `make test` runs every test.
# Both set up .venv first; both make sure a mosquitto binary exists.
# The first Python >= 3.11 on PATH (scripts/find-python), found before the virtualenv's
# bin goes first on PATH below; `make PYTHON=python3.12 ...` names one instead.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell scripts/find-python 2>/dev/null)
endif
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BROKER_PORT ?= 1883
# $(CURDIR), not $(abspath): abspath splits a path that holds a space, and a clone may live anywhere.
export PATH := $(CURDIR)/$(BIN):$(PATH)
PYTEST_ARGS ?=

.PHONY: FORCE python-info bench-tracing bench-logging bench-normalize bench-flood bench-flood-victim bench-mcp-output bench-client compose-check check-tree asyncapi-parser mcp-everything bench bench-nodelay run test test-quick lint format typecheck schemas check broker stop-broker clean mosquitto-binary mosquitto-clients redis-binary chromium-binary

# An ordinary editable install: the source root worker/ holds the package toolbus/ (a src
# layout), which mypy, pytest and editors read as the files they are.
$(STAMP): pyproject.toml
	@scripts/ensure-python $(PYTHON)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

FORCE:

mosquitto-binary:
	@scripts/ensure-mosquitto

# The broker, and mosquitto_rr/mosquitto_sub: the tests run docs/integrations.md's commands.
mosquitto-clients:
	@scripts/ensure-mosquitto --clients

# The tests start their own redis-server (the shared dedup store) on a free port.
redis-binary:
	@scripts/ensure-redis

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
run: python-info $(STAMP) broker
	TOOLBUS_BROKER_URL="$${TOOLBUS_BROKER_URL:-mqtt://localhost:$(BROKER_PORT)}" $(BIN)/toolbus serve --config config/toolbus.toml

# The virtualenv's Python once it exists, else the one it will be made with.
python-info:
	@scripts/find-python --say $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))

# A tracing backend for the end-to-end tracing test, in a venv of its own (its pins are its own).
# A stamp, not the phoenix binary, marks it done: an install cut short is redone, not trusted.
PHOENIX_VENV  := .venv-phoenix
PHOENIX_STAMP := $(PHOENIX_VENV)/.installed
$(PHOENIX_STAMP):
	$(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/pip install --quiet --upgrade pip
	$(PHOENIX_VENV)/bin/pip install --quiet 'arize-phoenix>=12,<30'
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
test: $(STAMP) mosquitto-clients redis-binary chromium-binary asyncapi-parser mcp-everything $(PHOENIX_STAMP) $(NODE_RED_STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# The quick loop: everything but the `integration` tests (no Phoenix or Node-RED install).
test-quick: $(STAMP) mosquitto-clients redis-binary chromium-binary asyncapi-parser mcp-everything
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

check: check-tree lint typecheck test compose-check

clean:
	rm -rf $(VENV) $(PHOENIX_VENV) $(NODE_RED_DIR) build worker/toolbus.egg-info .pytest_cache .mypy_cache .ruff_cache .run .tools

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

bench-nodelay: $(STAMP) mosquitto-clients
	$(BIN)/python bench/tcp_nodelay.py
