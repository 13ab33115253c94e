"""The local spool: records back in order, a cap that refuses (the caller drops and counts), a
record torn by ``kill -9`` mid-append cut off when the spool is opened again, and a full disk
(a real small tmpfs) that fails an append and leaves the file whole."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from cascade.store.spool import Spool
from tests.store.helpers import small_disk


def test_records_come_back_in_order_and_the_cap_refuses(tmp_path: Path):
    spool = Spool(tmp_path / "s", max_bytes=200)
    assert spool.append([["rows", [["k1", 1.5, None]]]], 1)
    assert spool.append([["shadow", [["x", 2]]]], 2)
    assert not spool.append([["rows", ["y" * 300]]], 1)  # past the cap: nothing written
    assert [(batch, rows) for batch, rows, _ in spool.records()] == [
        ([["rows", [["k1", 1.5, None]]]], 1),
        ([["shadow", [["x", 2]]]], 2),
    ]
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


def test_a_full_disk_fails_the_append_and_leaves_every_whole_record(tmp_path: Path):
    with small_disk(tmp_path / "disk", "64k") as disk:
        spool = Spool(disk / "s", max_bytes=1 << 30)  # the cap is not what stops it
        batch = [["rows", [["k" * 40, "x" * 3000]]]]
        appended = 0
        with pytest.raises(OSError) as full:
            for _ in range(100):
                assert spool.append(batch, 1)
                appended += 1
        assert full.value.errno == errno.ENOSPC and appended > 5
        # Nothing of the failed record stays: the file is its whole records, and the next
        # append (after a replay emptied it) goes on from there.
        assert (disk / "s").stat().st_size == spool.size
        assert [rows for _, rows, _ in spool.records()] == [1] * appended == [1] * spool.rows
        spool.clear()
        assert spool.append(batch, 1)
        assert len(list(spool.records())) == 1
