# Everything runs from a virtual environment the targets create: .venv for the default python3, and
# .venv-pythonX.Y for another interpreter, so that both legs of CI live side by side
# (`make test PYTHON=python3.12` gives the newest jax: jax 0.11 and later need Python >= 3.12).
PYTHON ?= python3
VENV ?= $(if $(filter python3,$(PYTHON)),.venv,.venv-$(notdir $(PYTHON)))
# pyenv installs 3.12 and 3.13 without putting them on PATH (its shim refuses to run them): then take the
# newest installed pyenv version of that name.
PYTHON_EXE := $(shell $(PYTHON) -c 'import sys; print(sys.executable)' 2>/dev/null || \
	ls -d $$(pyenv root 2>/dev/null)/versions/$(patsubst python%,%,$(notdir $(PYTHON)))*/bin/$(notdir $(PYTHON)) 2>/dev/null | sort -V | tail -n 1)
PY := $(VENV)/bin/python

.PHONY: install install-test run test test-avx2 stress samples bench clean

# Two installs into the same venv, each with its own stamp: `make run` needs only the package (the MNIST demo
# uses jax's own example libraries), `make test` adds the test and samples extras (flax, equinox, openvino, IREE,
# ray, tritonclient...: about 2.3 GB). A venv made by `make run` is upgraded by a later `make test`, and one made
# by `make test` serves `make run` as it is.
EXTRAS_run :=
EXTRAS_test := [test,samples]
# `make run` takes whichever install the venv already has.
RUN_STAMP = $(if $(wildcard $(VENV)/.installed-test),$(VENV)/.installed-test,$(VENV)/.installed-run)

install: $(VENV)/.installed-run
install-test: $(VENV)/.installed-test

# CONSTRAINTS=file pins versions inside the supported range (.ci/oldest.txt: the oldest stack CI tests).
CONSTRAINTS ?=

$(VENV)/.installed-%: setup.cfg pyproject.toml $(CONSTRAINTS)
	@test -n "$(PYTHON_EXE)" || { echo "no interpreter found for PYTHON=$(PYTHON)" >&2; exit 1; }
	test -x $(PY) || $(PYTHON_EXE) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.$(EXTRAS_$*)' $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	$(PY) -c 'import jax, onnxruntime, sys; print(f"installed: Python {sys.version.split()[0]}, jax {jax.__version__}, onnxruntime {onnxruntime.__version__}")'
	touch $@

run: $(RUN_STAMP)
	$(PY) samples/mnist_train.py --epochs 2 --num-train 6400 --check

# Exit code 5 (no tests collected) must fail: make propagates pytest's code as-is.
test: install-test
	$(PY) -m pytest -n auto -q -p no:cacheprovider

# The suite as on a CPU without AVX-512 (docs/runtime.md, "CPUs without AVX-512"): OpenVINO's oneDNN and
# OpenBLAS (LAPACK under jax.jit, and its matmul) limited to AVX2; XLA's own flag changed nothing measured.
AVX2_ENV = ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell XLA_FLAGS=--xla_cpu_max_isa=AVX2
test-avx2: install-test
	$(AVX2_ENV) $(PY) -m pytest -n auto -q -p no:cacheprovider $(TESTS)

# The long reliability runs (the fuzzer's large corpus, models over 2 GB): hours of CPU, not for every change.
stress: install-test
	$(PY) -m pytest -q -p no:cacheprovider -m stress

# Every sample runs even when one fails its check; the exit code still says so (see samples/README.md on
# MNIST's 10 epochs: --noise-floor prints how far jax.jit drifts from itself).
samples: install-test
	status=0; \
	$(PY) samples/mnist_train.py --epochs 10 --check --noise-floor || status=1; \
	$(PY) samples/jaxmd_minimize.py --check || status=1; \
	$(PY) samples/jaxcfd_channel_flow.py --check || status=1; \
	exit $$status

bench: install-test
	$(PY) benchmarks/bench_mnist.py

clean:
	rm -rf .venv .venv-* build *.egg-info
