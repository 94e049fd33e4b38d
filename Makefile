# Everything runs from .venv, created by `make install`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test stress samples bench clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,samples]'
	touch $(STAMP)

run: install
	$(PY) samples/mnist_train.py --epochs 2 --num-train 6400 --check

# Exit code 5 (no tests collected) must fail: make propagates pytest's code as-is.
test: install
	$(PY) -m pytest -n auto -q -p no:cacheprovider

# The long reliability runs (the fuzzer's large corpus, models over 2 GB): hours of CPU, not for every change.
stress: install
	$(PY) -m pytest -q -p no:cacheprovider -m stress

# Every sample runs even when one fails its check; the exit code still says so (see samples/README.md on
# MNIST's 10 epochs: --noise-floor prints how far jax.jit drifts from itself).
samples: install
	status=0; \
	$(PY) samples/mnist_train.py --epochs 10 --check --noise-floor || status=1; \
	$(PY) samples/jaxmd_minimize.py --check || status=1; \
	$(PY) samples/jaxcfd_channel_flow.py --check || status=1; \
	exit $$status

bench: install
	$(PY) benchmarks/bench_mnist.py

clean:
	rm -rf $(VENV) build *.egg-info
