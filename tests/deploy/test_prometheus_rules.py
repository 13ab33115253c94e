"""deploy/prometheus: promtool accepts the rules and the scrape config, runs the rules' unit
tests, and those tests cover every rule (an alert firing and not firing, every recording rule
evaluated). promtool comes with Debian's ``prometheus``; without it these tests fail."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.deploy import promql
from tests.servers import require_tool


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", promql.RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(promql.rule_exprs())} rules found" in result.stdout


def test_promtool_check_config_with_its_rule_file() -> None:
    result = promtool("check", "config", promql.DEPLOY / "prometheus" / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", promql.RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """The unit tests bite: the demo-weights alert watching the wrong label value fails them."""
    rules = promql.RULES.read_text()
    assert rules.count('cascade_build_info{demo="true"}') == 1
    (tmp_path / "alerts.yml").write_text(rules.replace('{demo="true"}', '{demo="false"}'))
    shutil.copy(promql.RULE_TESTS, tmp_path / "alerts.test.yml")
    result = promtool("test", "rules", "alerts.test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "alertname: CascadeDemoWeightsServing" in result.stdout + result.stderr


def test_every_rule_is_unit_tested_firing_and_not_firing() -> None:
    groups = promql.load_yaml(promql.RULES)["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    records = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    tests = promql.load_yaml(promql.RULE_TESTS)["tests"]
    fires = {
        t["alertname"]
        for case in tests
        for t in case.get("alert_rule_test", [])
        if t.get("exp_alerts")
    }
    silent = {
        t["alertname"]
        for case in tests
        for t in case.get("alert_rule_test", [])
        if not t.get("exp_alerts")
    }
    exprs = " ".join(t["expr"] for case in tests for t in case.get("promql_expr_test", []))
    assert alerts - fires == set(), "alerts never tested firing"
    assert alerts - silent == set(), "alerts never tested not firing"
    assert {r for r in records if r not in exprs} == set(), "recording rules never evaluated"
    assert len(alerts) >= 10 and len(records) >= 4


def test_rules_read_only_what_cascade_exports() -> None:
    exported, recorded = promql.exported_names(), promql.recorded_names()
    for expr in promql.rule_exprs():
        assert promql.referenced_names(expr.expr) <= exported, expr
    used = {name for expr in promql.rule_exprs() for name in recorded if name in expr.expr}
    assert used == recorded  # every recording rule feeds an alert
