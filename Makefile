# toolbus: `make run` starts a worker with the bundled defaults, `make test` runs every test.
# Both set up .venv first; both make sure a mosquitto binary exists.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BROKER_PORT ?= 1883
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: bench-tracing bench-normalize compose-check bench run test lint typecheck schemas check broker stop-broker clean mosquitto-binary

$(STAMP): pyproject.toml
	@scripts/ensure-python $(PYTHON)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

mosquitto-binary:
	@scripts/ensure-mosquitto

# Starts a local broker on $(BROKER_PORT) unless something already listens there.
broker: mosquitto-binary
	@scripts/local-broker start $(BROKER_PORT)

stop-broker:
	@scripts/local-broker stop $(BROKER_PORT)

run: $(STAMP) broker
	$(BIN)/toolbus serve --config config/toolbus.toml

# A tracing backend for the end-to-end tracing test, in a venv of its own (its pins are its own).
PHOENIX := .venv-phoenix/bin/phoenix
$(PHOENIX):
	$(PYTHON) -m venv .venv-phoenix
	.venv-phoenix/bin/pip install --quiet --upgrade pip
	.venv-phoenix/bin/pip install --quiet 'arize-phoenix>=12,<30'

test: $(STAMP) mosquitto-binary $(PHOENIX)
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check worker tests bench
	$(BIN)/ruff format --check worker tests bench

typecheck: $(STAMP)
	$(BIN)/mypy worker

schemas: $(STAMP)
	$(BIN)/toolbus schemas --write

compose-check:
	scripts/check-compose

check: lint typecheck test compose-check

clean:
	rm -rf $(VENV) .venv-phoenix .pytest_cache .mypy_cache .ruff_cache .run

bench: $(STAMP) mosquitto-binary
	$(BIN)/toolbus bench

bench-tracing: $(STAMP) mosquitto-binary
	$(BIN)/toolbus bench --tracing

bench-normalize: $(STAMP)
	$(BIN)/python bench/normalize.py
