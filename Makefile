# README's two commands: `make run` (set up + default matrix + report) and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
BENCH  := $(VENV)/bin/bench
STAMP  := $(VENV)/.installed-stamp
# `make test` skips suites marked slow; under CI (CI=true) it runs everything.
MARKS  := $(if $(filter true 1,$(CI)),,-m "not slow")
# Horovod (allreduce impl = horovod) is built from source by `make horovod`, not by setup: the
# build takes minutes. CI builds it before testing so that tests/distributed/test_horovod.py
# runs there; elsewhere that test skips when horovod is missing.
HOROVOD_STAMP := $(VENV)/.horovod-stamp
TEST_NEEDS := setup $(if $(filter true 1,$(CI)),horovod)

.PHONY: setup horovod run test test-all lint format benchmarks clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,mpi]'
	touch $(STAMP)

setup: $(STAMP)

$(HOROVOD_STAMP): $(STAMP) scripts/build_horovod.sh
	scripts/build_horovod.sh $(PY)
	touch $(HOROVOD_STAMP)

horovod: $(HOROVOD_STAMP)

run: setup
	$(BENCH) run matrices/quick.toml --out results/quick
	$(BENCH) report results/quick
	@echo "report: results/quick/report.md (and report.csv)"

test: $(TEST_NEEDS)
	$(VENV)/bin/ruff check hetbench tests benchmarks
	$(VENV)/bin/pytest $(MARKS) -q

test-all: $(TEST_NEEDS)
	$(VENV)/bin/pytest -q

lint: setup
	$(VENV)/bin/ruff check hetbench tests benchmarks

format: setup
	$(VENV)/bin/ruff check --fix hetbench tests benchmarks

benchmarks: setup
	$(VENV)/bin/pytest benchmarks -q --benchmark-only

clean:
	rm -rf $(VENV) results .pytest_cache .ruff_cache
