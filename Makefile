# nodeagent: the two commands a newcomer needs are `make demo` and `make test`.
# Both install what they need on a Debian machine (run as root: the test
# environment starts CRI-O, which needs root).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: test demo deps testenv lint types contracts unit integration drills security fuzz compat e2e beside-udevd rpm image image-twice container-e2e proto clean

## test: install everything, then lint, types, import contracts and all tests (with a sample
## of the fault drills: pyproject's addopts deselect the drill_long ones)
test: deps lint types contracts
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## demo: registry, stick, power cut and a 3-node site on this machine, no cluster needed; it
## prepares only what it uses (Debian packages, CRI-O), not kube-apiserver nor the nspawn root
demo: $(VENV)/.installed
	$(BIN)/python -m tests.testenv.demo

deps: $(VENV)/.installed testenv

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --editable '.[dev]'
	touch $@

## testenv: Debian packages, the CRI-O build and the nspawn root the tests use (all cached)
testenv: $(VENV)/.installed
	$(BIN)/python -m tests.testenv prepare

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

## types: mypy --strict on the daemon and on the code that tests, measures and builds it
types: $(VENV)/.installed
	$(BIN)/mypy nodeagent tests bench tools

contracts: $(VENV)/.installed
	$(BIN)/lint-imports

unit: $(VENV)/.installed
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: deps
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

## drills: every fault drill against the real daemon, CRI-O and registry (tests/faults)
drills: deps
	$(BIN)/python -m pytest tests/faults -m drill $(PYTEST_ARGS)

## security: every attack test of docs/security.md against the real components (tests/security)
security: deps
	$(BIN)/python -m pytest tests/security -m security $(PYTEST_ARGS)

## fuzz: run the fuzz harnesses (tests/fuzz) until every entry point has had FUZZ_BUDGET inputs
## on its current code, resuming from earlier runs (results per harness in FUZZ_CACHE, keyed by
## a hash of the code each harness exercises); a harness stops after FUZZ_BUDGET_S s per run,
## FUZZ_JOBS at a time. Writes build/fuzz/report.md and report.json (tools/fuzz_report.py);
## exits 0 only when everything is at budget. ~4 h from nothing on 2 cores: run it in parts.
FUZZ_BUDGET   ?= 100000
FUZZ_BUDGET_S ?= 3600
FUZZ_JOBS     ?= 2
FUZZ_CACHE    ?= $(HOME)/.cache/nodeagent-fuzz
FUZZ_ARGS     ?=
fuzz: $(VENV)/.installed
	$(BIN)/python tools/fuzz_report.py --budget $(FUZZ_BUDGET) --budget-s $(FUZZ_BUDGET_S) \
	  --jobs $(FUZZ_JOBS) --cache-dir $(FUZZ_CACHE) $(FUZZ_ARGS)

## compat: the suites at the edges pyproject allows (tests/testenv/compat.py): on Python 3.11 with
## every runtime dependency at its lower bound (unit, service, HTTP), and on Debian 13's Python
## 3.13 under systemd-nspawn with the current ones (unit, service). ~6 min once cached.
## make test runs the fast part (tests/compat).
compat: deps
	$(BIN)/python -m tests.testenv.compat all -- $(PYTEST_ARGS)

## e2e: the RPM installed in a Debian root booted under systemd-nspawn (tests/e2e);
## E2E_FLAVOUR=distribution: the flavour built --without bundled_deps (decision 0076)
e2e: deps
	NODEAGENT_E2E_FLAVOUR=$(or $(E2E_FLAVOUR),bundled) $(BIN)/python -m pytest tests/e2e $(PYTEST_ARGS)

## beside-udevd: every test that uses udev (single-node sticks, the site's stick, e2e media)
## beside a udevd in the host's namespaces that the tests did not start, as on a systemd-booted
## machine: this machine's own, or a stand-in where none runs (tests/testenv/beside_udevd.py)
beside-udevd: deps
	$(BIN)/python -m tests.testenv.beside_udevd $(PYTEST_ARGS)
## rpm: build nodeagent's RPMs with rpmbuild into build/rpm (%check runs the unit tests);
## RHEL 9: make rpm PYTHON3_PKGVERSION=3.11 (its python3 is 3.9; the launcher and the
## Requires then name python3.11)
rpm: deps
	$(BIN)/python tools/build_rpm.py --output build/rpm \
		$(if $(PYTHON3_PKGVERSION),--python3-pkgversion $(PYTHON3_PKGVERSION))

## image: nodeagent's OCI image (tools/build_image.py) into build/image, with the layout as one
## tar for a stick (build/image/nodeagent-<version>.oci.tar); prints the manifest's digest
image: deps
	$(BIN)/python tools/build_image.py --output build/image --archive

## image-twice: two builds from empty caches (debootstrap, wheels) must give the same digest
## (one SOURCE_DATE_EPOCH for both: a commit between them would change it)
image-twice: deps
	rm -rf build/image-twice
	epoch=$${SOURCE_DATE_EPOCH:-$$(git log -1 --format=%ct)}; \
	for n in 1 2; do \
	  SOURCE_DATE_EPOCH=$$epoch NODEAGENT_TESTENV_CACHE=$(CURDIR)/build/image-twice/cache$$n \
	    $(BIN)/python tools/build_image.py --output build/image-twice/out$$n \
	    | tail -n 1 > build/image-twice/digest$$n || exit 1; \
	done
	cat build/image-twice/digest1 build/image-twice/digest2
	cmp build/image-twice/digest1 build/image-twice/digest2

## container-e2e: the container variant under systemd-nspawn with Debian's podman: first image
## from a stick, READY, journal, pins, kill and restart, the RPM units' counterparts, a
## self-update from a bundle and a broken one rolled back (tests/e2e/test_container_unit.py)
container-e2e: deps
	$(BIN)/python -m pytest tests/e2e/test_container_unit.py -m container_long $(PYTEST_ARGS)

## proto: regenerate the CRI message modules from nodeagent/adapters/cri/api/runtime_v1.proto
proto: $(VENV)/.installed
	$(BIN)/python tools/gen_cri_proto.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
