# The two Quickstart commands: `make serve` and `make test`. Each creates .venv and installs
# the pinned dependencies on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha256sum | cut -c1-12)
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: serve test bench check clean k8s-rules

$(STAMP):
	rm -f $(VENV)/.installed-*
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# clef-finetune ships Cloudflare's reference file (our test oracle). Its torchvision
	# requirement does not import beside torch 2.13.0 and is not needed: install without it.
	$(BIN)/pip install -q --no-deps clef-finetune==0.1.0 peft==0.21.2 pyyaml==6.0.4
	touch $@

serve: $(STAMP)
	$(BIN)/cascade serve --demo --host $(HOST) --port $(PORT)

test: $(STAMP)
	$(BIN)/ruff check cascade tests
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/cascade bench gateway

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# The Kubernetes PrometheusRule is the Prometheus rule file wrapped; tests/deploy fails on drift.
k8s-rules: $(STAMP)
	$(BIN)/python -c 'import sys, yaml; rules = yaml.safe_load(open("deploy/prometheus/alerts.yml")); \
	print("# Generated from deploy/prometheus/alerts.yml by make k8s-rules: edit that file, not this."); \
	yaml.safe_dump({"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", \
	"metadata": {"name": "cascade"}, "spec": rules}, sys.stdout, sort_keys=False, width=100)' \
	> deploy/k8s/base/prometheusrule.yaml
