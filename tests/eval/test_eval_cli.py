"""``cascade eval`` and ``cascade calibrate`` end to end on the demo tiers (tiny random weights):
summary.json agrees exactly with items.jsonl, reruns resume from the cache, calibrations are
stamped and checked."""

from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec
import pytest

from cascade.cli import main
from cascade.policy.calibration import read_calibration, write_calibration

CONFIDENCE = {"low_confidence", "low_margin"}
ANGER = ["calm", "upset", "furious"]


def _data(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    teams = {"billing": "Payments", "tech": "Bugs", "sales": "Sales", "legal": "Legal"}
    lines = []
    for i in range(n):
        state = f"ticket {i}: " + " ".join(
            rng.choice(["refund", "crash", "price", "login", "invoice", "contract"])
            for _ in range(6)
        )
        # The demo serves the default policy's thresholds: the tiny random Laya clears them on
        # the three-point score and mostly not on the other two, so the demo shows both paths.
        questions = {
            "urgent": {"type": "noul", "instructions": "Is it urgent?"},
            "team": {"type": "choice", "instructions": "Which team?", "criteria": teams},
            "anger": {"type": "score", "instructions": "How angry?", "criteria": ANGER},
        }
        gold = {
            "urgent": rng.random() < 0.5,
            "team": rng.choice(list(teams)),
            "anger": rng.choice(ANGER),
        }
        lines.append(
            json.dumps(
                {
                    "id": f"t{i}",
                    "state": state,
                    "questions": questions,
                    "gold": gold,
                    "source": "synthetic",
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def demo_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path_factory.getbasetemp() / "eval-demo-tiers"
    monkeypatch.setenv("CASCADE_DEMO_DIR", str(root))
    return root


def _items(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]


def _recomputed(items: list[dict]) -> dict:
    """The summary's headline figures, recomputed from items.jsonl by hand."""

    def acc(rows: list[dict], pick) -> float:
        return sum(pick(r)["answer"] == r["gold"] for r in rows) / len(rows)

    scored = [r for r in items if r["gold_index"] is not None]
    cascade = [r for r in items if r["cascade"] is not None]
    gated = [
        r
        for r in cascade
        if r["cheap"] is not None
        and not r["cascade"]["pre_routed"]
        and r["cascade"]["reason"] in (None, *CONFIDENCE)
    ]
    judged = [r for r in cascade if r["cheap"] is not None and r["gold_index"] is not None]
    both = [r for r in items if r["cheap"] is not None and r["strong"] is not None]
    return {
        "cheap": acc([r for r in scored if r["cheap"]], lambda r: r["cheap"]),
        "strong": acc([r for r in scored if r["strong"]], lambda r: r["strong"]),
        "cascade": acc([r for r in scored if r["cascade"]], lambda r: r["cascade"]),
        "escalation_rate": sum(r["cascade"]["tier"] == "strong" for r in cascade) / len(cascade),
        "confidence_escalation_rate": sum(r["cascade"]["reason"] in CONFIDENCE for r in gated)
        / len(gated),
        "fixed": sum(
            r["cheap"]["answer"] != r["gold"] and r["cascade"]["answer"] == r["gold"]
            for r in judged
        ),
        "broke": sum(
            r["cheap"]["answer"] == r["gold"] and r["cascade"]["answer"] != r["gold"]
            for r in judged
        ),
        "agreement": sum(r["cheap"]["answer"] == r["strong"]["answer"] for r in both) / len(both),
    }


def test_eval_demo_end_to_end_agrees_with_its_items_and_resumes(tmp_path: Path, demo_dir: Path):
    data = _data(tmp_path / "data.jsonl", 24, seed=1)
    out = tmp_path / "out"
    assert main(["eval", str(data), "--demo", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    items = _items(out)
    assert summary["demo"] is True and "DEMO" in (out / "summary.md").read_text()
    assert len(items) == summary["questions"] == 24 * 3 and summary["items"] == 24
    tiers = summary["tiers"]
    figures = _recomputed(items)
    assert tiers["cheap"]["accuracy"] == figures["cheap"]
    assert tiers["strong"]["accuracy"] == figures["strong"]
    assert tiers["cascade"]["accuracy"] == figures["cascade"]
    for key in ("escalation_rate", "confidence_escalation_rate", "fixed", "broke"):
        assert tiers["cascade"][key] == figures[key], key
    assert summary["agreement"]["cheap_strong"] == figures["agreement"]
    assert 0 < figures["escalation_rate"] < 1  # the demo shows both paths
    assert len(tiers["cascade"]["deferral_curve"]) >= 10
    for name in ("reliability.png", "deferral.png", "cost.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a rerun makes no tier call: every answer comes from the cache
    cache = {p.name: p.read_bytes() for p in (out / "cache").iterdir()}
    assert main(["eval", str(data), "--demo", "--out", str(out), "--no-progress"]) == 0
    assert {p.name: p.read_bytes() for p in (out / "cache").iterdir()} == cache
    assert _items(out) == items
    # an interrupted run (a torn last line) resumes: only the missing items run again
    cheap = out / "cache" / "cheap.jsonl"
    lines = cache["cheap.jsonl"].splitlines(keepends=True)
    cheap.write_bytes(b"".join(lines[:10]) + lines[10][:25])
    assert main(["eval", str(data), "--demo", "--out", str(out), "--no-progress"]) == 0
    assert len(cheap.read_bytes().splitlines()) == 11 + 14  # the torn line stays, ignored
    assert _items(out) == items


def test_calibrate_stamps_the_weights_and_eval_applies_or_refuses_it(
    tmp_path: Path, demo_dir: Path
):
    data = _data(tmp_path / "data.jsonl", 30, seed=2)
    cal_file = tmp_path / "cal.toml"
    assert (
        main(
            [
                "calibrate",
                str(data),
                "--demo",
                "--out",
                str(cal_file),
                "--target-escalation",
                "0.3",
                "--min-cell",
                "10",
                "--no-progress",
            ]
        )
        == 0
    )
    cal = read_calibration(cal_file)
    assert set(cal.stamp.checkpoints) == {"laya", "clef"}
    assert (cal.stamp.items, cal.stamp.target, cal.stamp.value) == (30, "escalation", 0.3)
    assert cal.thresholds.noul.get("2") is not None and cal.thresholds.choice.get("3-5")
    fitted = [f.escalation for f in cal.fit.values() if f.n]
    assert fitted and all(abs(e - 0.3) <= 0.05 for e in fitted)  # on its own data, per cell
    assert cal.fit["score:2"].n == 0 and cal.thresholds.score.get("2") is not None  # its band's
    out = tmp_path / "out"
    assert (
        main(
            [
                "eval",
                str(data),
                "--demo",
                "--out",
                str(out),
                "--calibration",
                str(cal_file),
                "--no-progress",
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["calibration"] == str(cal_file)
    assert summary["tiers"]["cascade"]["confidence_escalation_rate"] == pytest.approx(0.3, abs=0.05)
    other = msgspec.structs.replace(
        cal,
        stamp=msgspec.structs.replace(
            cal.stamp, checkpoints={**cal.stamp.checkpoints, "laya": "0" * 64}
        ),
    )
    write_calibration(cal_file, other)
    with pytest.raises(
        SystemExit,
        match=f"made for {'0' * 64}, the configured weights are {cal.stamp.checkpoints['laya']}",
    ):
        main(["eval", str(data), "--demo", "--out", str(out), "--calibration", str(cal_file)])


def _with_long_states(path: Path, n: int, seed: int) -> Path:
    """``_data``'s tickets, every fourth with a state long enough that only the choice question
    (long criteria) truncates: it is pre-routed strong, its siblings reach the gate."""
    _data(path, n, seed)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for i, line in enumerate(lines):
        line["questions"]["team"]["criteria"]["billing"] = "Payments " * 30
        if i % 4 == 0:
            line["state"] += " refund" * 425
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_calibrate_and_eval_count_the_same_gated_questions(
    tmp_path: Path, demo_dir: Path, capsys: pytest.CaptureFixture[str]
):
    fitted, held_out = (
        _with_long_states(tmp_path / f"{h}.jsonl", 40, seed=20 + i) for i, h in enumerate("ab")
    )
    cal_file = tmp_path / "cal.toml"
    assert (
        main(
            [
                "calibrate",
                str(fitted),
                "--demo",
                "--out",
                str(cal_file),
                "--json",
                "--target-escalation",
                "0.3",
                "--no-progress",
            ]
        )
        == 0
    )
    fit = json.loads(capsys.readouterr().out)
    figures = []
    for data in (fitted, held_out):
        out = tmp_path / data.stem
        assert (
            main(
                [
                    "eval",
                    str(data),
                    "--demo",
                    "--out",
                    str(out),
                    "--calibration",
                    str(cal_file),
                    "--no-progress",
                ]
            )
            == 0
        )
        cascade = json.loads((out / "summary.json").read_text())["tiers"]["cascade"]
        items = _items(out)
        assert any(r["cascade"]["reason"] == "state_too_long" for r in items)
        figures.append((cascade["confidence_escalation_rate"], cascade["gated_questions"]))
    # on the data it was fitted on: the same questions, the same share, exactly
    assert figures[0] == (fit["escalation"], fit["gated_questions"])
    assert abs(fit["escalation"] - 0.3) < 0.02
    rate, n = figures[1]  # held out: within sampling error (three standard deviations)
    assert abs(rate - 0.3) <= 3 * (0.3 * 0.7 / n) ** 0.5


def test_eval_replays_the_option_order_check_and_reports_each_signal(
    tmp_path: Path, demo_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    policy = tmp_path / "checked.toml"
    # the 3-5 bands' thresholds lowered, so the team choice and the anger score both reach it
    text = Path("policies/default.toml").read_text().replace('"3-5" = 0.65', '"3-5" = 0.3')
    policy.write_text(
        text.replace('"3-5" = 0.55', '"3-5" = 0.3')
        + "\n[consistency]\nmargin = 1.0\norders = 1\nmax_extra_rows = 8\n"
    )
    monkeypatch.setenv("CASCADE_POLICY", str(policy))
    data = _data(tmp_path / "data.jsonl", 16, seed=3)
    out = tmp_path / "out"
    assert main(["eval", str(data), "--demo", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    items = _items(out)
    cascade = [r["cascade"] for r in items if r["cascade"] is not None]
    checked = [c for c in cascade if c["order_stable"] is not None]
    moved = [c for c in checked if not c["order_stable"]]
    check = summary["tiers"]["cascade"]["order_check"]
    assert checked and check["checked"] == len(checked) and check["moved"] == len(moved)
    assert {c["reason"] for c in moved} <= {"order_unstable", "whole_request"}
    # the random tiny Laya moves some winners and keeps others
    assert 0 < check["flip_rate"] < 1
    unstable = sum(c["reason"] == "order_unstable" for c in cascade)
    assert summary["tiers"]["cascade"]["signals"]["order_unstable"]["questions"] == unstable
    assert check["extra_rows_per_item"] == sum(c["order_rows"] for c in checked) / 16 == 2
    kept = [
        r
        for r in items
        if r["cascade"] and r["cascade"]["reason"] is None and r["gold_index"] is not None
    ]
    assert summary["tiers"]["cascade"]["signals"]["kept"]["cheap_accuracy"] == sum(
        r["cheap"]["answer"] == r["gold"] for r in kept
    ) / len(kept)
    assert check["extra_tokens_per_item"] > 0
    assert "Option-order check" in (out / "summary.md").read_text()


def _foreign(path: Path, n: int, seed: int) -> Path:
    """Items unlike ``_data``'s: long states of other words, the same questions."""
    rng = random.Random(seed)
    words = [
        "weather",
        "lisbon",
        "sunny",
        "winds",
        "harvest",
        "tractor",
        "wheat",
        "sonata",
        "violin",
        "glacier",
        "orchestra",
        "barley",
    ]
    lines = []
    for line in _data(path, n, seed).read_text().splitlines():
        item = json.loads(line)
        item |= {
            "id": "far-" + item["id"],
            "source": "foreign",
            "state": " ".join(rng.choice(words) for _ in range(rng.randint(40, 80))),
        }
        lines.append(json.dumps(item))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_calibrate_fits_a_reference_set_and_eval_flags_the_foreign_items(
    tmp_path: Path, demo_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    policy = tmp_path / "novelty.toml"
    policy.write_text(
        Path("policies/default.toml").read_text()
        + "\n[novelty]\nmin_rows = 20\nmax_flag_rate = 0.05\n"
    )
    monkeypatch.setenv("CASCADE_POLICY", str(policy))
    cal_file = tmp_path / "cal.toml"
    assert (
        main(
            [
                "calibrate",
                str(_data(tmp_path / "fit.jsonl", 40, seed=4)),
                "--demo",
                "--out",
                str(cal_file),
                "--target-escalation",
                "0.3",
                "--no-progress",
            ]
        )
        == 0
    )
    cal = read_calibration(cal_file)
    assert cal.novelty is not None and cal.novelty.file == "cal.novelty.npz"
    mix = tmp_path / "mix.jsonl"
    mix.write_text(
        _data(tmp_path / "near.jsonl", 12, seed=5).read_text()
        + _foreign(tmp_path / "far.jsonl", 12, seed=6).read_text()
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "eval",
                str(mix),
                "--demo",
                "--out",
                str(out),
                "--calibration",
                str(cal_file),
                "--no-progress",
            ]
        )
        == 0
    )
    cascade = json.loads((out / "summary.json").read_text())["tiers"]["cascade"]
    by_source = cascade["novelty"]["by_source"]
    assert by_source["foreign"]["flag_rate"] >= 0.9
    assert by_source["synthetic"]["flag_rate"] <= 0.25
    novel = [r for r in _items(out) if r["cascade"]["reason"] == "novel"]
    assert novel and cascade["signals"]["novel"]["questions"] == len(novel)
    assert "Novelty gate" in (out / "summary.md").read_text()
    npz = tmp_path / "cal.novelty.npz"
    npz.write_bytes(npz.read_bytes() + b"\0")  # not the file the calibration names
    with pytest.raises(SystemExit, match="the calibration names reference set"):
        main(["eval", str(mix), "--demo", "--out", str(out), "--calibration", str(cal_file)])
