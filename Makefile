# Two entry points for a fresh machine (see README):
#   make demo   - virtualenv, install, run the main job `plsh reproduce`
#   make test   - install test/docs/fast extras, lint (ruff, mypy), run the whole test suite and the docs build
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed first, by itself: TORCH_SPEC is the requirement (the version the project
# is tested with), TORCH_INDEX an index to take it from instead of pip's configured ones.
# On Linux the public index (PyPI) serves the CUDA build of torch; a CPU-only machine whose
# pip sees only PyPI runs
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (the PyTorch CPU wheel index, passed to pip as --index-url); a CUDA machine runs plain
# `make test`. Empty TORCH_INDEX: pip's own configuration decides (a machine may serve a
# CPU wheel from a local index already).
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=

.PHONY: demo test venv install-test lint tests docs clean mutants

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

demo: $(BIN)/python
	$(BIN)/pip install --quiet -e .
	$(BIN)/plsh reproduce

install-test: $(BIN)/python
	$(BIN)/pip install --quiet $(if $(strip $(TORCH_INDEX)),--index-url "$(TORCH_INDEX)") "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test,fast,docs,hf]"

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m mypy

# The interpreted Triton gradient tests (tests/fast/test_gradient_precision.py) compare
# float32 dots of two operand layouts bit for bit; numpy's matmul rounds them as the BLAS
# kernel OpenBLAS picks for the CPU does (its Haswell and Zen kernels apart, its Sandybridge
# kernel alike), so on x86-64 that file runs in a second pytest call with the kernel pinned.
# Only that file: the pinned kernel makes numpy's GEMMs ~1.8x slower, and every other test
# passes under any kernel.
# The kernel is the Makefile's own variable BLAS_CORETYPE, not OPENBLAS_CORETYPE: a machine
# whose environment already sets OPENBLAS_CORETYPE (seen 2026-12-02: Haswell) would
# otherwise override the pin through make's `?=`.
BLAS_CORETYPE := $(if $(filter x86_64,$(shell uname -m)),Sandybridge,)
BLAS_PINNED_TESTS := tests/fast/test_gradient_precision.py

# --dist loadfile: each test file runs on one worker, so the one that runs
# tests/fast/triton/test_aot_compile.py compiles its report while the other goes on with the
# rest (split over both, one waits ~55 s on the other's lock). Not --dist loadgroup: with
# pytest >= 9.2 pytest-xdist 3.8 no longer groups by xdist_group (pytest-xdist issue 1386;
# measured 2026-12-03), and that test file checks that its worker compiled the report.
tests:
	$(BIN)/python -m pytest -n 2 --dist loadfile --durations=20 --ignore=$(BLAS_PINNED_TESTS) tests
	$(if $(BLAS_CORETYPE),OPENBLAS_CORETYPE=$(BLAS_CORETYPE)) $(BIN)/python -m pytest -n 2 --durations=5 $(BLAS_PINNED_TESTS)

# Both builders share one doctree folder: the doctest build reuses the environment the html
# build pickled instead of reading every page again.
docs:
	$(BIN)/python -m sphinx -W --keep-going -n -b html -d docs/_build/doctrees docs docs/_build/html
	$(BIN)/python -m sphinx -W --keep-going -n -b doctest -d docs/_build/doctrees docs docs/_build/doctest

# lint, tests and docs are independent (the tests build no docs, the docs run no tests):
# they run side by side, each one's output printed whole when it ends. mypy and most of the
# html build use one core each; next to the two test workers they fill the cores that the
# one-after-the-other order left idle (benchmarks/results/make_test_2026-12-03.md).
test: install-test
	$(MAKE) -j3 --output-sync=target lint tests $(if $(wildcard docs/conf.py),docs)

# mutation testing of one module (not part of `make test`: minutes per module), e.g.
#   make mutants MODULE=plsh_ref/alibi.py
# writes mutation/reports/<module>.md; see CONTRIBUTING.md "Mutation testing"
mutants:
	@if [ -z "$(MODULE)" ]; then echo "usage: make mutants MODULE=plsh_ref/<module>.py"; exit 2; fi
	$(BIN)/python -c "import mutmut" 2>/dev/null || $(BIN)/pip install --quiet -e ".[mutation]"
	$(BIN)/python mutation/run.py $(MODULE)

clean:
	rm -rf docs/_build build dist *.egg-info .pytest_cache .hypothesis
