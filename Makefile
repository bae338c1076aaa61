# fairseq-distattn developer entry points.
#
#   make quickstart   set up .venv if needed, then train + evaluate a small model
#   make test         set up .venv if needed, then run the test suite
#   make lint         set up .venv if needed, then ruff: lint and formatting check (CI runs it)
#
# Both are idempotent: the virtualenv is created once and `pip install -e .[test]`
# reruns only when pyproject.toml or constraints.txt change (stamp: .venv/.installed).

SHELL := /bin/bash

# Prefer Python 3.11 (fairseq-fixed, what CI tests); fall back to whatever python3 is,
# if it is at least MIN_PYTHON (pyproject's requires-python): the torch that
# constraints.txt pins has no wheels for older ones.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
MIN_PYTHON := 3.10
VENV := .venv
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# test processes (pytest-xdist): one per core, at most 4 (each builds its own session fixtures)
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))

.PHONY: all install quickstart test lint clean distclean

all: test

install: $(STAMP)

$(VENV)/bin/python:
	@test -n "$(PYTHON)" || { echo "error: no python3.11 or python3 on PATH" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < tuple(map(int, "$(MIN_PYTHON)".split("."))))' || { \
		echo "error: $(PYTHON) is Python $$($(PYTHON) -c 'import platform; print(platform.python_version())'), the package needs >= $(MIN_PYTHON) (torch 2.13 has no wheels for older ones); install python3.11, or give make PYTHON=/path/to/python3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

# PIP_CONSTRAINT (an absolute path: it is also read by the isolated build of the
# fairseq-fixed sdist, which runs in another directory) keeps pip on the CPU torch
# pinned in constraints.txt and on numpy<2.
$(STAMP): pyproject.toml constraints.txt | $(VENV)/bin/python
	PIP_CONSTRAINT="$(CURDIR)/constraints.txt" $(VENV)/bin/python -m pip install -e '.[test]'
	touch $@

quickstart: $(STAMP)
	bash scripts/quickstart.sh

test: $(STAMP)
	$(VENV)/bin/python -m pytest tests -q -p no:cacheprovider --durations=10 -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf work/quickstart build *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
