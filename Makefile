# xlscale: `make demo` runs the main job (the CPT study), `make demo-mt` the translation study
# (MT paper), `make test` runs the checks, `make paper-check` fits a synthetic paper-scale study
# (every run of the papers' manifests, from their own laws) and prints fitted vs paper values.
# All set themselves up.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Python caches each module's bytecode (__pycache__/*.pyc) on first import, unless
# PYTHONDONTWRITEBYTECODE is set, as it is on some CI and sandbox images: then every process
# compiles TensorFlow, JAX and seqio from source again, ~20 s of CPU per job start on 2 cores,
# and a test suite or a sweep starts hundreds. The recipes here run with it unset.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup comet-env gpu-test-wheels test test-fast lint format docs docs-check demo demo-smoke demo-mt demo-mt-smoke paper-check clean

setup: $(STAMP)

# A new environment takes ~5.5 GiB (JAX, TensorFlow, torch, libtpu) and pip unpacks wheels
# beside it: refuse up front, naming the folder and the space, rather than fail mid-install.
MIN_FREE_GIB ?= 7

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -c 'import os, shutil, sys; \
		d = os.path.dirname(os.path.abspath(sys.argv[1])); free = shutil.disk_usage(d).free / 2**30; \
		need = float(sys.argv[2]); free >= need or sys.exit( \
		f"make setup: {d} has {free:.1f} GiB free; a new {sys.argv[1]} needs about {need:g} GiB. " \
		"Free some space, or set MIN_FREE_GIB=0 to try anyway.")' $(VENV) $(MIN_FREE_GIB)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip setuptools wheel
	# --no-compile: Python compiles what is imported, on first import (the venv has ~24,000 files;
	# see PYTHONDONTWRITEBYTECODE above).
	$(BIN)/python -m pip install --no-compile -e '.[test,eval,hf]'
	@touch $(STAMP)

# COMET's own environment (`.comet-venv/`, beside `.venv`): unbabel-comet's pins (numpy<2,
# transformers<5) cannot share the JAX/TF stack's, so COMET runs there as a subprocess
# (`pipelines/comet/worker.py`); COMET_PYTHON names its interpreter (default: this venv's).
COMET_VENV ?= .comet-venv
COMET_STAMP := $(COMET_VENV)/.installed

comet-env: $(COMET_STAMP)

$(COMET_STAMP): pipelines/comet/requirements.txt
	@test -x $(COMET_VENV)/bin/python || $(PYTHON) -m venv $(COMET_VENV)
	$(COMET_VENV)/bin/python -m pip install -q --no-compile -r pipelines/comet/requirements.txt
	@touch $(COMET_STAMP)

# Wheels for `pytest -m gpu` on a JAX GPU image (Python >= 3.11, as this project) that cannot
# reach the network (the lent GPU machines): pytest and the libraries the GPU tests import beyond
# JAX and numpy, at this venv's versions (msgpack, PyYAML and array-record, which the
# prepared-data reader needs, built for each Python of GPU_PYTHONS), into GPU_WHEELS
# (git-ignored). Carry the folder to the GPU machine; there, offline, install what it lacks and
# run the GPU tests from the repository root:
#   for p in $$(cat .gpu-wheels/names.txt); do python -m pip install -q --no-index \
#     --find-links .gpu-wheels --no-deps "$$p"; done; python -m pytest -m gpu
GPU_WHEELS ?= .gpu-wheels
GPU_PYTHONS ?= 3.11 3.12 3.13
GPU_TEST_PACKAGES := pytest pluggy iniconfig packaging pygments flax optax etils absl-py msgpack \
	pyyaml array-record rich markdown-it-py mdurl typing-extensions treescope cloudpickle filelock

gpu-test-wheels: setup
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(BIN)/python -c 'import sys; from importlib.metadata import version; \
		print("\n".join(f"{n}=={version(n)}" for n in sys.argv[1:]))' \
		$(GPU_TEST_PACKAGES) > $(GPU_WHEELS)/requirements.txt
	printf '%s\n' $(GPU_TEST_PACKAGES) > $(GPU_WHEELS)/names.txt
	for py in $(GPU_PYTHONS); do \
		$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --dest $(GPU_WHEELS) \
			--python-version $$py --implementation cp --platform manylinux2014_x86_64 \
			--platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
			-r $(GPU_WHEELS)/requirements.txt || exit 1; \
	done
	@ls $(GPU_WHEELS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# libtpu (jax[tpu]'s TPU compiler, pinned as jax 0.10.2 requires) in a folder of its own, off the
# venv's import path: the memory-model test compiles a paper size for a TPU topology ahead of time
# with it (XLSCALE_LIBTPU -> TPU_LIBRARY_PATH in that test only), while every other process keeps
# a plain CPU JAX without libtpu's start-up warnings. Only `make test` needs it.
LIBTPU_VERSION := 0.0.42.1
LIBTPU_DIR := $(VENV)/libtpu-aot
LIBTPU_STAMP := $(LIBTPU_DIR)/.installed

$(LIBTPU_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --no-deps --target $(LIBTPU_DIR) libtpu==$(LIBTPU_VERSION)
	@touch $(LIBTPU_STAMP)

# The suite runs in TEST_WORKERS processes (pytest-xdist; work stealing balances the long
# end-to-end tests); TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
# xmanager's local executor (its imports only, pinned in tests/xmanager_local_requirements.txt)
# in a folder of its own, off the venv's import path: the xmanager launcher's test runs a sweep
# through it with the folder on PYTHONPATH (XLSCALE_XMANAGER_PATH); xmanager's full requirements
# (Vertex AI, Kubernetes, protobuf<7) stay out of the JAX/TF stack. Only `make test` needs it.
XM_DIR := $(VENV)/xmanager-local
XM_STAMP := $(XM_DIR)/.installed

$(XM_STAMP): $(STAMP) tests/xmanager_local_requirements.txt
	rm -rf $(XM_DIR)
	$(BIN)/python -m pip install -q --no-deps --no-compile --target $(XM_DIR) \
		-r tests/xmanager_local_requirements.txt
	@touch $(XM_STAMP)

test: lint docs-check $(LIBTPU_STAMP) $(XM_STAMP)
	XLSCALE_LIBTPU=$(abspath $(LIBTPU_DIR))/libtpu/libtpu.so \
	XLSCALE_XMANAGER_PATH=$(abspath $(XM_DIR)) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15

# The fast tests alone (`-m "not slow"`: no lint, no docs build, no end-to-end training, no
# trainer subprocess, no SLURM cluster; libtpu for the TPU compile-only tests, xmanager's tests
# are all slow): under 3 minutes on a 2-core machine, for the edit-test loop. A test of more than
# about 2 s is marked `slow` (docs/testing.md). `make test` stays the whole suite.
test-fast: $(LIBTPU_STAMP)
	XLSCALE_LIBTPU=$(abspath $(LIBTPU_DIR))/libtpu/libtpu.so \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15 -m "not slow"

# The documentation site (mkdocs.yml; pages in docs/) into DOCS_SITE (git-ignored). `make docs`
# rewrites the results pages and README's results summary from their measurement records
# (docs/results/data/*.json, docs/gen_results.py), then builds the site; `make docs-check`, a step
# of `make test`, fails instead when they are out of date. Either fails on a broken link, a
# missing page or anchor, or a docstring the API reference cannot render (--strict). The `docs`
# extra is installed into the venv when missing or when pyproject.toml changed.
DOCS_SITE ?= site
DOCS_STAMP := $(VENV)/.docs-installed
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet --site-dir $(DOCS_SITE)

# The `docs` extra's pins alone (the project itself is installed by `setup`).
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))' > $(VENV)/docs-requirements.txt
	$(BIN)/python -m pip install -q --no-compile -r $(VENV)/docs-requirements.txt
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/python docs/gen_results.py
	$(MKDOCS)

docs-check: $(DOCS_STAMP)
	$(BIN)/python docs/gen_results.py --check
	$(MKDOCS)

demo: setup
	$(BIN)/xlscale demo

demo-smoke: setup
	$(BIN)/xlscale demo --profile smoke

demo-mt: setup
	$(BIN)/xlscale demo --study mt

demo-mt-smoke: setup
	$(BIN)/xlscale demo --study mt --profile smoke

# Writes paper_check_out/ (runs, fits), prints the table; exits non-zero on a FAIL row.
paper-check: setup
	$(BIN)/python -m studies.paper_check --out paper_check_out

clean:
	rm -rf $(VENV) $(COMET_VENV) demo_out paper_check_out .pytest_cache
