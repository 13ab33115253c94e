"""``cascade replay``: the report as a table, JSON and HTML; its error paths (a missing log, a
file that is no log, a bad policy with FILE:LINE lines, a bad flag) and their exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade.cli import main
from tests.replay.helpers import ask, policy_text, served


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six requests logged with every question escalated."""
    tmp = tmp_path_factory.mktemp("log")
    policy, log = tmp / "a.toml", tmp / "d.db"
    policy.write_text(policy_text(1.0))
    with served(policy, log) as client:
        for n in range(6):
            ask(client, n)
    return log


def test_the_report_as_json_table_and_html(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "b.toml"
    policy.write_text(policy_text(0.0))  # every answer kept cheap
    assert (
        main(
            [
                "replay",
                "--policy",
                str(policy),
                "--from-log",
                str(log),
                "--json",
                "--cost",
                "strong=10",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] == 6 and report["judged"] == 18
    assert report["tier_changes"] == {"cheap_to_strong": 0, "strong_to_cheap": 18}
    assert report["strong_share"] == {"served": 1.0, "candidate": 0.0}
    assert report["cost"]["per_1k_tokens"] == {"cheap": 20.0, "strong": 10.0}
    assert report["candidate"]["policy"] == str(policy) and not report["truncated"]
    out = tmp_path / "replay.html"
    assert (
        main(
            [
                "replay",
                "--policy",
                str(policy),
                "--from-log",
                str(log),
                "--limit",
                "2",
                "--report",
                str(out),
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert table.startswith("2 requests, 6 questions: 6 judged, 0 not judged (--limit cut")
    assert "6 strong->cheap" in table and "strong share" in table
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "strong share" in page and "r1" in page


def test_a_missing_log_or_a_file_that_is_no_log_is_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "b.toml"
    policy.write_text(policy_text(0.0))
    missing = tmp_path / "nothing.db"
    assert main(["replay", "--policy", str(policy), "--from-log", str(missing)]) == 1
    assert capsys.readouterr().err.strip() == f"cascade replay: error: {missing}: no such file"
    text = tmp_path / "notes.db"
    text.write_text("not a database, just some words\n" * 100)
    assert main(["replay", "--policy", str(policy), "--from-log", str(text)]) == 1
    assert capsys.readouterr().err.startswith(f"cascade replay: error: {text}: not a decision")


def test_a_bad_policy_is_exit_1_with_file_line_errors(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "bad.toml"
    lines = policy_text(0.0, extra="[shadow]\nfraction = 2.0\n").splitlines()
    policy.write_text("\n".join(lines) + "\n")
    assert main(["replay", "--policy", str(policy), "--from-log", str(log)]) == 1
    at = lines.index("fraction = 2.0") + 1
    assert capsys.readouterr().err.strip() == (
        f"{policy}:{at}: error: `shadow.fraction`: Expected `float` <= 1.0"
    )


def test_a_report_that_is_not_html_is_a_usage_error(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "b.toml"
    policy.write_text(policy_text(0.0))
    assert (
        main(
            [
                "replay",
                "--policy",
                str(policy),
                "--from-log",
                str(log),
                "--report",
                str(tmp_path / "r.png"),
            ]
        )
        == 2
    )
    assert "--report writes HTML" in capsys.readouterr().err
    assert not (tmp_path / "r.png").exists()
