# CPU machines: `make test` sets up .venv and runs the whole suite under Triton's interpreter.
# GPU machines: `make test-gpu` and `make bench` use the machine's own python3 (torch + triton there).

VENV ?= .venv
PY := $(VENV)/bin/python
GPU_PY ?= python3

.PHONY: setup build check test test-gpu bench

setup: $(VENV)/.installed

# torch==2.13.0 is the CPU wheel on these machines (an unpinned torch pulls a multi-GB CUDA build);
# triton 3.8's interpreter works with numpy 2.4 (3.6's needs numpy < 2.4)
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 "triton==3.8.*"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

build: setup
	$(VENV)/bin/specgen build specs/

check: setup
	$(VENV)/bin/specgen build specs/ --check

test: setup
	TRITON_INTERPRET=1 $(PY) -m pytest -q

test-gpu:
	PYTHONPATH=$(CURDIR) $(GPU_PY) -m pytest -q

bench:
	PYTHONPATH=$(CURDIR) $(GPU_PY) -m bench
