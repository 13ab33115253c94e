"""``cascade bench fleet`` end to end on a real Redis and PostgreSQL: two replicas per scope,
phases of a few seconds; the JSON has every phase's figures for both scopes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.servers import run_redis

FIGURES = {"strong_share", "worst_window", "replicas", "kept", "spread", "labels", "reload"}


def test_bench_fleet_reports_both_scopes_per_phase(postgres, tmp_path: Path) -> None:
    store = postgres.database("bench_fleet")
    out = tmp_path / "fleet.json"
    with run_redis() as (redis, _):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "cascade",
                "bench",
                "fleet",
                "--replicas",
                "2",
                "--redis",
                redis,
                "--store",
                store,
                "--phase-duration",
                "4",
                "--window",
                "4",
                "--refit-every",
                "1",
                "--clients",
                "2",
                "--json",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["bench"] == "fleet" and result["replicas"] == 2
    assert set(result["scopes"]) == {"replica", "fleet"}
    for scope, run in result["scopes"].items():
        assert [p["phase"] for p in run["phases"]] == ["a", "b", "c"], scope
        assert len(run["replicas"]) == 3  # two, then the one that joined in phase c
        for phase in run["phases"]:
            assert FIGURES <= set(phase), (scope, phase["phase"])
            assert phase["questions"] > 0 and 0 <= phase["strong_share"] <= 1
            assert len(phase["replicas"]) >= 2  # per-replica shares beside the fleet's
            assert phase["labels"]["stored_ms"]["n"] > 0
            assert phase["reload"]["status"] == 200 and phase["reload"]["answered"]
        assert run["phases"][2]["joined_s"] is not None
    rows = [line.split()[:2] for line in done.stdout.splitlines()]
    assert all([phase, scope] in rows for phase in "abc" for scope in ("replica", "fleet"))


def test_bench_fleet_without_a_postgresql_store_says_so() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cascade", "bench", "fleet", "--store", "decisions.sqlite"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "bench fleet needs --store postgresql://" in done.stderr
