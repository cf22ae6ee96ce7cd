# The two commands of the README: `make demo` (the main job) and `make test` (install + tests).
# Both create .venv when missing and install what they need; a stamp keyed on pyproject.toml,
# scripts/install.sh and constraints.lock makes a second run skip the install. `make test-slow`
# runs the slow tests (installs into fresh environments, benchmark-like end-to-end runs); `make lock` rewrites constraints.lock,
# the exact versions install.sh installs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOCK := constraints.lock
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml scripts/install.sh $(LOCK) 2>/dev/null | sha1sum | cut -c1-12)

.PHONY: install demo lint test test-slow lock bench stop clean

$(STAMP): pyproject.toml scripts/install.sh $(LOCK)
	@bash scripts/install.sh "$(PYTHON)" "$(VENV)"
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)
	@bash scripts/ensure-system-deps.sh

demo: install
	@$(PY) -m trident_flows.demo

lint: install
	@$(VENV)/bin/ruff check trident_flows benchmarks tests examples

test: install lint
	@OMP_THREAD_LIMIT=1 $(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-slow: install
	@OMP_THREAD_LIMIT=1 $(PY) -m pytest -q -m slow $(PYTEST_ARGS)

# A freeze of .venv (after `make test` passed on it), less the project; keeps the lock file's header.
lock:
	@test -x $(PY) || { echo "$(VENV) is missing: run make install first" >&2; exit 1; }
	@{ sed '/^[^#]/,$$d' $(LOCK); \
	  $(PY) -m pip freeze --all --exclude-editable --exclude trident-flows | grep -v '^opencv-python=='; \
	  $(PY) -m pip freeze | sed -n 's/^opencv-python-headless==/opencv-python==/p'; } > $(LOCK).new
	@if cmp -s $(LOCK).new $(LOCK); then rm $(LOCK).new; echo "$(LOCK) is up to date"; \
	else mv $(LOCK).new $(LOCK) && echo "wrote $(LOCK) from $(VENV)"; fi

bench: install
	@for b in overhead observe observe-live optimize placement headroom closed-loop closed-loop-video faults sim-fidelity ray-data-import plan-fidelity dataplane closed-loop-suite; do $(VENV)/bin/trident-flows bench $$b || exit 1; done
	$(VENV)/bin/trident-flows bench closed-loop-sim --jobs 2

stop:
	@$(PY) -m trident_flows.demo --stop

clean:
	rm -rf $(VENV) .pytest_cache bench-results/quick demo-output
