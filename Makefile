# README's two commands: `make run` (set up + default matrix + report) and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
BENCH  := $(VENV)/bin/bench
STAMP  := $(VENV)/.installed-stamp
IS_CI  := $(filter true 1,$(CI))
# `make test` skips suites marked slow; under CI (CI=true) it runs everything.
MARKS  := $(if $(IS_CI),,-m "not slow")
# Horovod (allreduce impl = horovod) is built from source by `make horovod`, not by setup: the
# build takes minutes. Under CI `make test` builds it while the rest of the suite runs (see
# test-ci below) so that tests/distributed/test_horovod.py runs there; elsewhere that test
# skips when horovod is missing.
HOROVOD_STAMP := $(VENV)/.horovod-stamp
HOROVOD_TEST  := tests/distributed/test_horovod.py
TEST_NEEDS := setup $(if $(IS_CI),horovod)

.PHONY: setup horovod run test test-quick test-ci test-all lint format benchmarks clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,mpi]'
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

test: $(if $(IS_CI),test-ci,test-quick)

test-quick: setup
	$(VENV)/bin/ruff check hetbench tests benchmarks
	$(VENV)/bin/pytest $(MARKS) -q

# CI: scripts/build_horovod.sh runs in the background in its own session (setsid); with
# HOROVOD_BUILD_IDLE=1 it compiles with that session's scheduler autogroup at nice 19 (and its
# processes at nice 19, for kernels without autogroups), so it gets only the CPU the tests leave
# idle (waits for timeouts, paced and sleeping ranks) and does not disturb their timing (a plain
# `nice` would not do: processes in other autogroups share the CPU by group). When the suite
# without test_horovod.py is done, the build's autogroup goes back to nice 0 (allowed
# unprivileged); test_horovod.py runs once horovod is built. A failed build fails `make test`
# (its output is printed; whole log: build/horovod-build.log).
test-ci: setup
	$(VENV)/bin/ruff check hetbench tests benchmarks
	@mkdir -p build; \
	HOROVOD_BUILD_IDLE=1 setsid -w scripts/build_horovod.sh $(PY) >build/horovod-ci.log 2>&1 & \
	build=$$!; \
	echo "make: building horovod in the background (pid $$build, log build/horovod-ci.log)"; \
	$(VENV)/bin/pytest -q --ignore=$(HOROVOD_TEST); rc=$$?; \
	if [ $$rc -ne 0 ]; then kill -- -$$build 2>/dev/null; wait $$build; exit $$rc; fi; \
	{ echo 0 >/proc/$$build/autogroup; } 2>/dev/null; \
	echo "make: waiting for the horovod build"; \
	wait $$build; rc=$$?; cat build/horovod-ci.log; \
	if [ $$rc -ne 0 ]; then echo "make: the horovod build failed" >&2; exit $$rc; fi; \
	touch $(HOROVOD_STAMP); \
	$(VENV)/bin/pytest -q $(HOROVOD_TEST)

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
