# The two commands of the README: `make demo` (the main job) and `make test` (install + tests).
# Both create .venv when missing and install what they need; a stamp keyed on pyproject.toml
# makes a second run skip the install.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml scripts/install.sh 2>/dev/null | sha1sum | cut -c1-12)

.PHONY: install demo lint test bench stop clean

$(STAMP): pyproject.toml scripts/install.sh
	@bash scripts/install.sh "$(PYTHON)" "$(VENV)"
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)
	@bash scripts/ensure-system-deps.sh

demo: install
	@$(PY) -m trident_flows.demo

lint: install
	@$(VENV)/bin/ruff check trident_flows tests examples

test: install lint
	@OMP_THREAD_LIMIT=1 $(PY) -m pytest -q $(PYTEST_ARGS)

bench: install
	@for b in overhead observe observe-live optimize placement headroom closed-loop closed-loop-video faults sim-fidelity ray-data-import plan-fidelity dataplane closed-loop-suite; do $(VENV)/bin/trident-flows bench $$b || exit 1; done
	$(VENV)/bin/trident-flows bench closed-loop-sim --jobs 2
	$(VENV)/bin/trident-flows bench closed-loop-sim --workloads documents-256,video-256 --jobs 4 --out bench-results/closed-loop-sim-256

stop:
	@$(PY) -m trident_flows.demo --stop

clean:
	rm -rf $(VENV) .pytest_cache bench-results/quick demo-output
