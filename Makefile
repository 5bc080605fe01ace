# The two commands the README opens with: `make demo` and `make test`.
# Each creates .venv if it is missing and installs the project into it first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint unit bench scaling clean

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

$(VENV)/.bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'
	touch $@

bench: $(VENV)/.bench
	$(PY) tests/benchmarks/bench_userspace.py

# The iptables/nftables scaling experiment (root): docs/scaling.csv and docs/scaling.png.
scaling: $(VENV)/.bench
	$(PY) tests/benchmarks/scaling.py $(if $(SIZES),--sizes $(SIZES),)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
