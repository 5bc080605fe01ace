# The two commands the README opens with: `make demo` and `make test`.
# Each creates .venv if it is missing and installs the project into it first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint unit bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,dev]'
	touch $@

demo: $(VENV)/.installed
	$(PY) examples/demo.py

test: $(VENV)/.installed lint
	$(PY) -m pytest -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check kproxy emulation tests examples
	$(VENV)/bin/mypy --strict kproxy emulation

bench: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_userspace.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
