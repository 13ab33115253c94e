"""``cascade bench store --load``: three real ``cascade serve`` gateways (store off, SQLite,
PostgreSQL) on one fake upstream, driven in turn; the table and JSON side by side, and the
PostgreSQL gateway's rows in the database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade.cli import main
from cascade.store import read_rows
from tests.servers import Postgres


def test_goodput_and_cpu_of_each_store_side_by_side(
    postgres: Postgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    url = postgres.database("bench_load")
    out = tmp_path / "load.json"
    assert (
        main(
            [
                "bench",
                "store",
                "--load",
                "--tiers",
                "fake",
                "--postgres",
                url,
                "--clients",
                "2",
                "--seconds",
                "1",
                "--rounds",
                "2",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert [(r["clients"], r["store"]) for r in result["rows"]] == [
        (2, "off"),
        (2, "sqlite"),
        (2, "postgresql"),
    ]
    for row in result["rows"]:
        assert row["ok"] > 0 and row["not_ok"] == 0, row
        assert len(row["goodput_rounds"]) == len(row["cpu_rounds"]) == 2
        assert row["cpu_ms_per_ok"] > 0
        assert f"{row['goodput_per_s']:.2f}" in printed
    assert result["rows"][0]["vs_off"] == result["rows"][0]["cpu_vs_off"] == 1.0
    logged = {r.request_id for r in read_rows(url)}
    assert len(logged) == result["rows"][2]["ok"]  # every answer of the PostgreSQL gateway
    assert {r.replica for r in read_rows(url)} == {"bench-postgresql"}


def test_load_needs_a_database(capsys: pytest.CaptureFixture[str]):
    assert main(["bench", "store", "--load"]) == 2
    assert "--load needs --postgres URL" in capsys.readouterr().err
