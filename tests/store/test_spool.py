"""The local spool: records back in order, a cap that refuses (the caller drops and counts), and a
record torn by ``kill -9`` mid-append cut off when the spool is opened again."""

from __future__ import annotations

from pathlib import Path

from cascade.store.spool import Spool


def test_records_come_back_in_order_and_the_cap_refuses(tmp_path: Path):
    spool = Spool(tmp_path / "s", max_bytes=200)
    assert spool.append([["rows", [["k1", 1.5, None]]]], 1)
    assert spool.append([["shadow", [["x", 2]]]], 2)
    assert not spool.append([["rows", ["y" * 300]]], 1)  # past the cap: nothing written
    assert [(batch, rows) for batch, rows, _ in spool.records()] == [
        ([["rows", [["k1", 1.5, None]]]], 1), ([["shadow", [["x", 2]]]], 2)]
    assert (spool.rows, spool.size) == (3, (tmp_path / "s").stat().st_size)
    _, _, first_end = next(spool.records())
    assert [rows for _, rows, _ in spool.records(first_end)] == [2]
    spool.clear()
    assert (spool.rows, spool.size, list(spool.records())) == (0, 0, [])


def test_a_torn_last_record_is_cut_off(tmp_path: Path):
    spool = Spool(tmp_path / "s", max_bytes=1 << 20)
    spool.append([["rows", [["a"]]]], 1)
    whole = spool.size
    spool.append([["rows", [["b"]]]], 1)
    with open(tmp_path / "s", "r+b") as f:  # kill -9 halfway through the second append
        f.truncate(whole + 5)
    again = Spool(tmp_path / "s", max_bytes=1 << 20)
    assert (again.rows, again.size) == (1, whole)
    assert again.append([["rows", [["c"]]]], 1)
    assert [batch[0][1][0][0] for batch, _, _ in again.records()] == ["a", "c"]
