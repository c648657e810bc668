# vidlake — `make help` lists the targets.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Versions that were tested together; pip resolves within them.
CONSTRAINTS := constraints.txt
# The independent Iceberg reader of tests/catalog/test_duckdb_reader.py: DuckDB's
# iceberg/avro extension packages and the DuckDB release they are built for (older than
# the project's, and pinned by them), in a folder of their own beside the venv.
DUCKDB_READER := 1.5.5

.DEFAULT_GOAL := help
.PHONY: help venv demo test test-fast browser bench lint openapi clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned: a bare `torch` would pull a multi-GB CUDA build.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e ".[dev]"
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(VENV)/duckdb-reader \
	  "duckdb==$(DUCKDB_READER)" "duckdb-extension-iceberg==$(DUCKDB_READER)" \
	  "duckdb-extension-avro==$(DUCKDB_READER)"
	@touch $(STAMP)

venv: $(STAMP) ## create .venv and install vidlake with every extra

demo: $(STAMP) ## run the end-to-end demo on the embedded default (./.vidlake/)
	$(BIN)/vidlake demo

# Test processes (pytest-xdist): test files are dealt whole to each (`--dist loadfile`),
# so module fixtures stay in one process; each process starts its own S3 server and
# PostgreSQL. `make test PYTEST_WORKERS=0` runs in one process.
PYTEST_WORKERS ?= 2

test: $(STAMP) browser ## run the whole test suite (starts its own S3 server and PostgreSQL)
	$(BIN)/python -m pytest -q --durations=25 -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-fast: $(STAMP) ## the suite without slow, s3 and postgres tests
	$(BIN)/python -m pytest -q -m "not slow and not s3 and not postgres" $(PYTEST_ARGS)

browser: ## install Debian's chromium for the dashboard test (as root; else that test skips)
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium for the dashboard test"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "chromium could not be installed: the dashboard test will skip"; \
	  else echo "chromium is missing and this is not root: the dashboard test will skip"; fi; }

bench: $(STAMP) ## run every benchmark; each prints one JSON line
	@mkdir -p bench-results
	@for b in benchmarks/*.py; do echo "== $$b" >&2; $(BIN)/python $$b | tee -a bench-results/results.jsonl || exit 1; done

lint: $(STAMP) ## ruff (lint + format check) and mypy strict on the packages
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

openapi: $(STAMP) ## regenerate openapi/openapi.json from the app
	$(BIN)/python -m service.openapi_dump > openapi/openapi.json

clean: ## remove the demo's state (./.vidlake) and caches, keep .venv
	rm -rf .vidlake .pytest_cache .mypy_cache .ruff_cache .hypothesis
