# The two commands of the README:
#   make demo   sets up .venv (the package with its extras) and runs the demo
#   make test   sets up .venv and runs lint, format check, type check, the test suite
#               and the documentation site's build (warnings are errors)
# Everything the project needs is installed here; nothing is installed by hand.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# The lab extension is built by the package's build hook (pip install), so its sources
# are inputs of the install too.
LAB_SOURCES := $(wildcard labextension/src/*.ts labextension/src/widget/*.ts \
	labextension/tsconfig*.json labextension/style/* labextension/schema/* \
	labextension/generated/*.d.ts) \
	labextension/package.json labextension/yarn.lock

.PHONY: setup demo test lint docs browser-deps host-deps bench compare clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(LAB_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m nbckpt.demo

# The browser test drives Debian's Chromium (Playwright never downloads a browser here).
browser-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
		apt-get update && apt-get install -y --no-install-recommends chromium; \
	fi

# The multihost tests start an sshd inside each test host (network namespaces made by
# the tests themselves; see tests/sshhosts.py), a Slurm cluster on them with munge
# (tests/slurmhosts.py), and engines through Open MPI's mpiexec (tests/test_mpi_cluster.py).
# Their daemons are started by the tests, with configs and keys of their own.
HOST_PACKAGES := openssh-server openmpi-bin slurm-wlm munge
host-deps:
	@if [ ! -x /usr/sbin/sshd ] || [ ! -x /usr/bin/mpiexec ] || [ ! -x /usr/sbin/slurmctld ] \
		|| [ ! -x /usr/sbin/munged ]; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
			--no-install-recommends $(HOST_PACKAGES); \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m nbckpt.protocol.typescript --check
	cd labextension && PATH="$(CURDIR)/$(BIN):$$PATH" jlpm run lint:check

test: lint browser-deps host-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	$(MAKE) docs

# The site (docs/): Sphinx, warnings as errors. The teaching notebooks are rendered
# with the outputs of the test run that executed them (build/executed-notebooks/),
# or executed here when that run did not execute them as they are now.
docs: $(STAMP)
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "the site: docs/_build/html/index.html"

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_bench.py

# The side-by-side comparison with Orbax (the bench extra) and the disk's limit.
compare: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[dev,bench]"
	$(BIN)/python benchmarks/compare.py --sizes 64M,256M,1G,4G --reps 5

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
	rm -rf labextension/node_modules labextension/lib labextension/tsconfig.tsbuildinfo \
		nbckpt/labextension nbckpt/widgets/static docs/_build docs/_generated build/executed-notebooks
