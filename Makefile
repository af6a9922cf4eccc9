# CPU machines: `make test` sets up .venv and runs the whole suite under Triton's interpreter.
# GPU machines: `make test-gpu` and `make bench` use the machine's own python3 (torch + triton there).

VENV ?= .venv
PY := $(VENV)/bin/python
GPU_PY ?= python3

.PHONY: setup build check test test-newest test-gpu bench

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

# one pytest-xdist worker a core (the interpreter is single-threaded Python), torch one thread each
test: setup
	TRITON_INTERPRET=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto

# the newest Triton on the package index (3.9 now: raise NEWEST_TRITON when a newer one comes),
# beside the pinned one: installed into a folder of the venv that goes first on the path, and run
# on a quick subset (every op's property check, a few examples each, and the row-wise strategies)
NEWEST_TRITON ?= triton==3.9.*
NEWEST := $(VENV)/newest-triton

$(NEWEST)/.installed: $(VENV)/.installed
	$(PY) -m pip install -q --no-deps --target $(NEWEST) "$(NEWEST_TRITON)"
	touch $@

test-newest: $(NEWEST)/.installed
	PYTHONPATH=$(NEWEST) $(PY) -c "import triton; print('triton', triton.__version__, triton.__file__)"
	PYTHONPATH=$(NEWEST) TRITON_INTERPRET=1 OMP_NUM_THREADS=1 SPECGEN_PROFILE=dev $(PY) -m pytest -q \
		-p no:cacheprovider -n auto tests/test_ops.py tests/test_rowwise_runtime.py

test-gpu:
	PYTHONPATH=$(CURDIR) $(GPU_PY) -m pytest -q

bench:
	PYTHONPATH=$(CURDIR) $(GPU_PY) -m bench
