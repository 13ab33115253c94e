"""The calibration file's ``[snapshot]``: what ``cascade calibrate`` fits it from, how it reads
and writes, that older files without it still read, and that it reaches the policy (the drift
monitor's reference)."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from cascade.cli import main
from cascade.control.drift import DriftMonitor
from cascade.eval.decide import reaches_gate
from cascade.eval.fit import fit, snapshot
from cascade.policy.calibration import (
    CalibrationError,
    apply_calibration,
    read_calibration,
    temper,
    write_calibration,
)
from cascade.policy.model import ConfidenceHistogram
from tests.eval.test_calibration import CAL, POLICY
from tests.eval.test_fit import POLICY as FIT_POLICY
from tests.eval.test_fit import _rows, _synthetic
from tests.learn.generate import write

OLD_FILE = """version = 1

[stamp]
items = 10
questions = 9
target = "escalation"
value = 0.3

[stamp.checkpoints]
"laya" = "aaaa"

[thresholds.noul]
"2" = 0.7

[temperatures.noul]
"2" = 3.0
"""


def test_the_snapshot_counts_every_gated_confidence_tempered_per_cell() -> None:
    rows = _rows(FIT_POLICY, _synthetic(random.Random(4), 600))
    _, temperatures, _ = fit(rows, "escalation", 0.3)
    found = snapshot(rows, temperatures, 10)
    gated = [r for r in rows if reaches_gate(r)]
    assert set(found) == {f"{r.type}:{r.band}" for r in gated}
    for key, hist in found.items():
        members = [r for r in gated if f"{r.type}:{r.band}" == key]
        assert sum(hist.counts) == len(members)
        assert len(hist.counts) == 10  # continuous confidences: no ties merge bins
        t = temperatures[(members[0].type, members[0].band)]
        tempered = [max(temper(r.cheap.probabilities, t)) for r in members if r.cheap]
        below = sum(c < hist.edges[4] for c in tempered)
        assert below == sum(hist.counts[:5])  # the edges split the tempered confidences


def test_a_snapshot_round_trips_and_reaches_the_policy(tmp_path: Path) -> None:
    cal = msgspec.structs.replace(
        CAL,
        snapshot={
            "noul:2": ConfidenceHistogram(edges=[0.6, 0.75, 0.9], counts=[3, 2, 2, 2]),
            "choice:3-5": ConfidenceHistogram(edges=[], counts=[5]),
        },
    )
    write_calibration(tmp_path / "cal.toml", cal)
    assert '[snapshot."noul:2"]' in (tmp_path / "cal.toml").read_text()
    assert read_calibration(tmp_path / "cal.toml") == cal
    policy = apply_calibration(POLICY, cal, file="cal.toml")
    assert policy.calibration.snapshot == cal.snapshot
    monitor = DriftMonitor(
        msgspec.structs.replace(policy, drift=msgspec.structs.replace(policy.drift, min_count=9))
    )
    monitor.add(("noul", "2"), 0.8)
    assert monitor.cells[("noul", "2")].reference == cal.snapshot["noul:2"]


def test_a_file_without_a_snapshot_still_reads(tmp_path: Path) -> None:
    (tmp_path / "old.toml").write_text(OLD_FILE)
    old = read_calibration(tmp_path / "old.toml")
    assert old.snapshot == {}
    assert apply_calibration(POLICY, old, file="old.toml").calibration.snapshot == {}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("edges = [0.9, 0.5]\ncounts = [1, 1, 1]", "strictly ascending"),
        ("edges = [0.5, nan]\ncounts = [1, 1, 1]", "finite"),
        ("edges = [0.5]\ncounts = [1, 1, 1]", "1 edges need 2 counts, not 3"),
        ("edges = [0.5]\ncounts = [1, -1]", "counts must be >= 0"),
    ],
)
def test_a_broken_snapshot_names_the_file_and_the_cell(
    tmp_path: Path, table: str, message: str
) -> None:
    (tmp_path / "cal.toml").write_text(OLD_FILE + '\n[snapshot."noul:2"]\n' + table + "\n")
    with pytest.raises(CalibrationError, match=rf"cal.toml: snapshot noul:2: .*{message}"):
        read_calibration(tmp_path / "cal.toml")


def test_cascade_calibrate_writes_the_snapshot_of_every_gated_question(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cascade.clef.tiny import make_tiny as make_clef
    from cascade.laya.tiny import make_tiny as make_laya

    make_laya(tmp_path / "demo" / "laya-english")
    make_clef(tmp_path / "demo" / "clef-flash")
    data = write(tmp_path / "requests.jsonl", 40, seed=3)
    monkeypatch.setenv("CASCADE_DEMO_DIR", str(tmp_path / "demo"))
    out = tmp_path / "cal.toml"
    assert (
        main(
            [
                "calibrate",
                str(data),
                "--demo",
                "--out",
                str(out),
                "--target-escalation",
                "0.3",
                "--min-cell",
                "10",
            ]
        )
        == 0
    )
    capsys.readouterr()
    cal = read_calibration(out)
    assert "[snapshot." in out.read_text()
    assert sum(sum(h.counts) for h in cal.snapshot.values()) == cal.stamp.questions
    assert set(cal.snapshot) <= {
        f"{t}:{b}" for t in ("choice", "score", "noul") for b in ("2", "3-5", "6-10", "11+")
    }
