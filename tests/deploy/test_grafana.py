"""deploy/grafana: the provisioned datasource and the dashboard agree, and the dashboard reads
every metric family cascade exports (test_live_queries.py evaluates its PromQL)."""

from __future__ import annotations

from typing import Any

from tests.deploy import promql


def test_every_panel_uses_the_provisioned_datasource() -> None:
    (source,) = promql.load_yaml(promql.DATASOURCES)["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    board = promql.dashboard()
    uid = {"type": "prometheus", "uid": source["uid"]}
    for panel in promql.panels(board):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == uid, panel["title"]
        assert panel["targets"] and all(t["datasource"] == uid for t in panel["targets"])
    for variable in board["templating"]["list"]:
        assert variable["datasource"] == uid


def test_dashboard_model() -> None:
    board = promql.dashboard()
    assert board["schemaVersion"] >= 39 and board["uid"] == "cascade-overview"
    ids = [panel["id"] for panel in promql.panels(board)]
    assert len(ids) == len(set(ids))
    for panel in promql.panels(board):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
    names = [v["name"] for v in board["templating"]["list"]]
    assert names == ["instance", "tier"]
    for variable in board["templating"]["list"]:
        assert variable["multi"] and variable["includeAll"]
        promql.label_values_query(variable["definition"])  # a query test_live_queries can run


# Panels about the whole cascade, whatever tiers are selected: the escalation ratio divides by
# the questions every tier answered.
# So is the fleet's strong share, weighted by the questions each replica answered.
WHOLE_CASCADE = {"Escalation ratio and its baseline", "Strong share: the fleet and each replica"}


def test_panels_filter_on_the_template_variables() -> None:
    tiered = promql.exported_names(labelled="tier")
    for panel, expr in promql.dashboard_exprs(promql.dashboard()):
        names = promql.referenced_names(expr.expr)
        if names or "up{" in expr.expr:
            assert 'instance=~"$instance"' in expr.expr, expr
        if names & tiered and panel["title"] not in WHOLE_CASCADE:
            assert 'tier=~"$tier"' in expr.expr, expr


def test_dashboard_reads_every_exported_metric_family() -> None:
    exprs = [expr.expr for _, expr in promql.dashboard_exprs(promql.dashboard())]
    read = set().union(*(promql.referenced_names(e) for e in exprs))
    exported = promql.exported_names()
    assert read <= exported, read - exported
    families = {
        name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
        for name in exported
    }
    unread = {f for f in families if not any(n.startswith(f) for n in read)}
    assert unread == set()


def test_build_info_shows_demo_weights_at_a_glance() -> None:
    board = promql.dashboard()
    weights = next(p for p in promql.panels(board) if p["title"] == "Weights")
    assert weights["type"] == "stat" and weights["gridPos"]["y"] <= 1
    assert 'demo="true"' in weights["targets"][0]["expr"]
    mapped = weights["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert mapped["1"]["text"] == "DEMO WEIGHTS" and mapped["1"]["color"] == "red"


def test_weights_show_no_data_rather_than_real_weights() -> None:
    """Without any cascade_build_info (nothing scraped) the stat has no value: it must say so,
    not fall back to 0 and show green "real weights"."""
    weights = next(p for p in promql.panels(promql.dashboard()) if p["title"] == "Weights")
    expr = weights["targets"][0]["expr"]
    assert "vector(" not in expr  # a constant would stand in for missing data
    assert expr.count("cascade_build_info{") == 2  # demo -> 1, any other build -> 0
    defaults = weights["fieldConfig"]["defaults"]
    assert defaults["noValue"] == "no data"
    base = defaults["thresholds"]["steps"][0]
    assert base["value"] is None and base["color"] not in {"green", "red"}
    (special,) = [m for m in defaults["mappings"] if m["type"] == "special"]
    assert special["options"]["match"] == "null+nan"
    assert special["options"]["result"]["color"] not in {"green", "red"}
    (values,) = [m for m in defaults["mappings"] if m["type"] == "value"]
    greens = [k for k, v in values["options"].items() if v["color"] == "green"]
    assert greens == ["0"]


def is_rate(expr: str) -> bool:
    """A per-second rate of a counter, drawn as is (not a quantile or a ratio of rates)."""
    return "rate(" in expr and "histogram_quantile" not in expr and " / " not in expr


def unit_of(panel: dict[str, Any], ref: str) -> str:
    """The unit Grafana draws target ``ref`` in: its override by query, else the default."""
    unit = panel["fieldConfig"]["defaults"].get("unit", "")
    for override in panel["fieldConfig"].get("overrides", []):
        if override["matcher"] == {"id": "byFrameRefID", "options": ref}:
            unit = next((p["value"] for p in override["properties"] if p["id"] == "unit"), unit)
    return unit


def test_rate_panels_are_per_second() -> None:
    checked = 0
    for panel in promql.panels(promql.dashboard()):
        if panel["type"] not in {"timeseries", "stat"}:
            continue
        for target in panel["targets"]:
            if is_rate(target["expr"]):
                unit = unit_of(panel, target["refId"])
                assert unit == "reqps" or unit.endswith("/s"), (panel["title"], unit)
                checked += 1
    assert checked >= 8
