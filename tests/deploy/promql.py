"""The PromQL that ships in deploy/: dashboard targets, alert and recording rules, the adapter's
HPA query; Grafana's template variables expanded the way Grafana does; the metric names that
cascade/metrics.py exports, to check every expression against."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import Counter, Gauge, Histogram, Info

from cascade import metrics

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "cascade.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
ADAPTER = DEPLOY / "k8s" / "components" / "hpa-queue-wait" / "prometheus-adapter-values.yaml"


@dataclass(frozen=True)
class Expr:
    where: str  # "panel 'Title' A", "rule CascadeX", ...
    expr: str


def exported_names(labelled: str | None = None) -> set[str]:
    """Every series name cascade/metrics.py can produce (counters end in _total, histograms
    have _bucket/_sum/_count, the Info metric is _info); with ``labelled``, only the names of
    metrics that carry that label."""
    names: set[str] = set()
    for obj in vars(metrics).values():
        if labelled is not None and labelled not in getattr(obj, "_labelnames", ()):
            continue
        if isinstance(obj, Counter):
            names.add(obj._name + "_total")
        elif isinstance(obj, Histogram):
            names.update(obj._name + suffix for suffix in ("_bucket", "_sum", "_count"))
        elif isinstance(obj, Info):
            names.add(obj._name + "_info")
        elif isinstance(obj, Gauge):
            names.add(obj._name)
    # Each app's own gauges (``metrics.GatewayGauges``, ``DriftGauges``, ``InflightGauge``,
    # ``ControlGauges``, ``CacheGauges``, ``ConfigInfo``),
    # read at scrape time.
    gauges = metrics.GatewayGauges(lambda: {"t": True}, lambda: {"t": 0}, lambda: {"v": "1"})
    drift = metrics.DriftGauges(lambda: {("noul", "2"): 0.0}, lambda: {("noul", "2"): 0.0})
    inflight = metrics.InflightGauge(lambda: 0)
    control = metrics.ControlGauges(lambda: {("noul", "2"): 0.5}, lambda: 0.0)
    cache = metrics.CacheGauges(lambda: (0, 0))
    config = metrics.ConfigInfo(lambda: ("p", "c"))
    for family in [
        *gauges.collect(),
        *drift.collect(),
        *inflight.collect(),
        *control.collect(),
        *cache.collect(),
        *config.collect(),
    ]:
        if labelled is None or all(labelled in s.labels for s in family.samples):
            names.update(sample.name for sample in family.samples)
    return names


def referenced_names(expr: str) -> set[str]:
    """``cascade_*`` series names an expression reads (recording rules' ``cascade:`` excluded)."""
    return set(re.findall(r"\bcascade_[a-z_]+\b", expr))


def recorded_names() -> set[str]:
    return {
        rule["record"]
        for group in load_yaml(RULES)["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(board: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' collapsed panels included."""
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_exprs(board: Mapping[str, Any]) -> list[tuple[dict[str, Any], Expr]]:
    return [
        (panel, Expr(f"panel {panel['title']!r} {target['refId']}", target["expr"]))
        for panel in panels(board)
        for target in panel.get("targets", [])
    ]


def rule_exprs() -> list[Expr]:
    return [
        Expr(f"rule {rule.get('alert') or rule.get('record')}", rule["expr"])
        for group in load_yaml(RULES)["groups"]
        for rule in group["rules"]
    ]


def adapter_exprs(matchers: str, group_by: str) -> list[Expr]:
    """The prometheus-adapter rules' metricsQuery with its Go template filled in as the adapter
    does for one HPA (``<<.LabelMatchers>>`` selects the pods, ``<<.GroupBy>>`` names them)."""
    out = []
    for rule in load_yaml(ADAPTER)["rules"]["custom"]:
        series = rule["seriesQuery"].split("{")[0]
        query = (
            rule["metricsQuery"]
            .replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", matchers)
            .replace("<<.GroupBy>>", group_by)
        )
        out.append(Expr(f"adapter {rule['name']['as']}", query))
    return out


def variable_regex(values: Sequence[str]) -> str:
    """A multi-value variable inside ``=~"..."``, as Grafana formats it: each value regex-escaped,
    alternatives in a group, backslashes doubled for the PromQL string literal."""
    escaped = [re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\\\1", value) for value in values]
    return "(" + "|".join(escaped) + ")"


def expand(expr: str, variables: Mapping[str, Sequence[str]], rate_interval: str) -> str:
    """Grafana's substitution of ``$__rate_interval`` and of the dashboard's variables."""
    out = expr.replace("$__rate_interval", rate_interval)
    for name in sorted(variables, key=len, reverse=True):
        out = re.sub(
            rf"\${name}\b|\$\{{{name}\}}", lambda _, n=name: variable_regex(variables[n]), out
        )
    if "$" in out:
        raise ValueError(f"unexpanded variable in {out!r}")
    return out


def label_values_query(definition: str) -> tuple[str, str]:
    """``label_values(selector, label)`` → (selector, label)."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", definition)
    if match is None:
        raise ValueError(f"not a label_values() query: {definition!r}")
    return match.group(1), match.group(2)
