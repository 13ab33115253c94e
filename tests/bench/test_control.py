"""``cascade bench control`` against a small fake gateway on loopback (seconds, not minutes):
the bench works end to end through the CLI, and its figures agree with what the gateway
answered and was told; the windows, oracle thresholds and synthetic labels are right."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from cascade.bench.control import (
    Answered,
    BenchItem,
    Cheap,
    Run,
    _asked,
    by_confidence,
    read_items,
    synthetic_label,
)
from cascade.bench.control_report import oracle_threshold, windows
from cascade.cli import main
from cascade.schema import ChoiceQuestion
from tests.bench.fake_gateway import FakeGateway, serving


def _data(path: Path) -> Path:
    """20 easy items (3 options, short) and 20 hard ones (12 options, longer states)."""
    lines = []
    for i in range(20):
        lines.append(
            {
                "id": f"easy-{i}",
                "state": f"short {i}",
                "questions": {
                    "q": {
                        "type": "choice",
                        "instructions": "Which?",
                        "criteria": {"a": "A", "b": "B", "c": "C"},
                    }
                },
                "gold": {"q": "a"},
            }
        )
        lines.append(
            {
                "id": f"hard-{i}",
                "state": f"a much longer state, number {i} " * 5,
                "questions": {
                    "q": {
                        "type": "choice",
                        "instructions": "Which?",
                        "criteria": {f"o{k}": f"O{k}" for k in range(12)},
                    }
                },
                "gold": {"q": "o0"},
            }
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_the_bench_against_a_fake_gateway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeGateway(admin_key="adm", ramp_s=1.0)
    with serving(fake) as url:
        code = main(
            [
                "bench",
                "control",
                "--url",
                url,
                "--requests",
                str(_data(tmp_path / "d")),
                "--phase-duration",
                "1.2",
                "--window",
                "0.6",
                "--scrape-every",
                "0.1",
                "--concurrency",
                "2",
                "--mix",
                "0.2,0.8",
                "--feedback-share",
                "1",
                "--synthetic-labels",
                "--with-forced",
                "--max-strong-share",
                "0.5",
                "--reloads",
                "2",
                "--admin-key",
                "adm",
                "--plot",
                str(tmp_path / "t.png"),
                "--json",
                str(tmp_path / "r.json"),
            ]
        )
    assert code == 0
    table = capsys.readouterr().out
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["items"] == 40 and result["hard_items"] == 20
    assert fake.probes == 40  # each item's cheap answer, once
    labels = {
        (fb["request_id"], q): label for fb in fake.feedback for q, label in fb["labels"].items()
    }
    for phase in result["phases"]:
        mine = [a for a in fake.answered if f"-p{phase['phase']}-" in a.rid]
        assert phase["requests"] == phase["questions"] == len(mine) > 10
        assert phase["failures"] == 0
        strong = sum(a.tier == "clef" for a in mine)
        assert phase["strong"] == strong
        assert phase["strong_share"] == pytest.approx(strong / len(mine))
        kept = [a for a in mine if a.tier == "laya"]
        right = sum(labels[(a.rid, a.qid)] == a.label for a in kept)  # every answer labelled
        assert phase["kept"]["n"] == phase["kept"]["judged"] == len(kept)
        assert phase["kept"]["accuracy"] == pytest.approx(right / len(kept))
        assert phase["kept"]["expected_accuracy"] == pytest.approx(0.95)  # f(c) = c, c = 0.95
        assert phase["max_window_share"] >= phase["strong_share"] - 1e-9 or phase["windows"] == 1
        # the oracle for f(c) = c at 0.9: keep every 0.95 answer, escalate every 0.3 one
        assert phase["oracle_thresholds"]["choice:3-5"]["threshold"] == 0.0
        assert phase["oracle_thresholds"]["choice:11+"]["threshold"] == 1.0
    one, two = result["phases"]
    assert one["strong_share"] < 0.5 < two["strong_share"]  # the mix changed: 20 % -> 80 % hard
    assert one["violations"] == 0 and two["violations"] == two["windows"] >= 1
    assert len(fake.feedback) == one["requests"] + two["requests"]
    assert one["feedback"] == {"200": one["requests"]}
    # the live threshold rose from 0.5 to 0.7 during phase 1 and the bench saw it
    live = one["thresholds"]["choice:3-5"]
    assert 0.5 <= live["first"] < live["last"] <= 0.7 + 1e-9
    assert two["thresholds"]["choice:3-5"]["first"] == pytest.approx(0.7)
    assert [p["strong_share"] for p in result["trajectory"] if "strong_share" in p]
    assert fake.reloads == [True, True]
    assert result["reloads"]["statuses"] == {"200": 2}
    assert result["run"]["failures"] == 0
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    assert "reloads: 2 asked (200 x2)" in table and "choice:3-5" in table


def _answered(t: float, tier: str) -> Answered:
    return Answered(
        t=t,
        phase=1,
        item="i",
        qid="q",
        cell="noul:2",
        tier=tier,
        reason=None,
        degraded=False,
        confidence=0.9,
        correct=None,
        expected=None,
    )


def test_windows_slide_inside_the_span_and_count_strong_answers() -> None:
    # one answer a second for 100 s; the strong tier answers seconds 40 to 59
    answered = [_answered(t, "clef" if 40 <= t < 60 else "laya") for t in range(100)]
    found = windows(answered, 0.0, 99.0, 20.0, "laya")
    assert found[0] == {"from_s": 0.0, "to_s": 20.0, "questions": 21, "share": 0.0}
    assert max(w["share"] for w in found) == pytest.approx(20 / 21)  # 40..60 holds 20 of 21
    assert found[-1]["to_s"] == 99.0 and all(w["to_s"] - w["from_s"] == 20.0 for w in found)
    assert len(found) == 80  # starts 0..79 s: steps of a twentieth of the window
    tail = windows(answered, 0.0, 99.5, 20.0, "laya")
    assert len(tail) == 81 and tail[-1]["from_s"] == 79.5  # and one more ending at the end
    (whole,) = windows(answered, 0.0, 99.0, 300.0, "laya")  # shorter than the window
    assert whole["share"] == pytest.approx(0.2)
    assert windows([], 0.0, 10.0, 5.0, "laya") == []


def test_the_oracle_threshold_is_the_lowest_whose_kept_mean_f_reaches_the_target() -> None:
    assert oracle_threshold([0.99, 0.95, 0.9, 0.5], 0.9) == pytest.approx(0.7)  # mean of 3: .947
    assert oracle_threshold([0.99, 0.95, 0.9, 0.8], 0.9) == 0.0  # all four: mean 0.91
    assert oracle_threshold([0.6, 0.5], 0.9) == 1.0
    # the mean over the kept reaches the target even where a single kept f(c) does not
    assert oracle_threshold([1.0, 0.85, 0.2], 0.9) == pytest.approx(0.525)


def test_synthetic_labels_make_the_cheap_answer_right_with_probability_c() -> None:
    asked = _asked(ChoiceQuestion(criteria=["a", "b", "c", "d"]))
    for c in (0.3, 0.7, 0.95):
        items = [
            BenchItem(id=f"i{k}", body={}, questions={"q": asked}, gold={}, hard=False)
            for k in range(4000)
        ]
        labels = [synthetic_label(7, item, "q", Cheap("b", c)) for item in items]
        right = sum(label == "b" for label in labels) / len(labels)
        assert right == pytest.approx(c, abs=0.025)
        wrong = [label for label in labels if label != "b"]
        assert set(wrong) == {"a", "c", "d"}  # the others, evenly
        assert labels == [synthetic_label(7, item, "q", Cheap("b", c)) for item in items]
    rng = random.Random(0)
    assert synthetic_label(1, items[0], "q", Cheap("b", rng.random())) in asked.labels


def test_read_items_marks_long_and_wide_items_hard(tmp_path: Path) -> None:
    items = read_items(_data(tmp_path / "d"), "jev-latest")
    assert {i.id for i in items if i.hard} == {f"hard-{k}" for k in range(20)}
    assert items[0].body["model"] == "jev-latest" and items[0].questions["q"].cell == "choice:3-5"
    assert len(read_items(None, "jev-latest")) > 200  # the bundled sample


def test_with_synthetic_labels_the_less_confident_half_is_hard(tmp_path: Path) -> None:
    items = read_items(_data(tmp_path / "d"), "jev-latest")
    run = Run(url="", phase_s=1.0, cheap_tier="laya")
    for n, item in enumerate(items):  # confidence rises with the item's place, whatever its kind
        run.cheap[(item.id, "q")] = Cheap("a", 0.3 + n / 100)
    replayed = by_confidence(items, run)
    assert [i.id for i in replayed] == [i.id for i in items if not i.forced]
    gated = [i.id for i in items if not i.forced]
    assert [i.id for i in replayed if i.hard] == gated[: len(gated) // 2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mix", "2"], "--mix 2: give two shares in [0, 1]"),
        (["--feedback-share", "1.5"], "--feedback-share 1.5: give a share in [0, 1]"),
        (["--phase-duration", "0"], "--phase-duration 0.0: must be > 0"),
        (["--reloads", "2", "--url", "http://127.0.0.1:1"], "--admin-key with --url"),
    ],
)
def test_bad_flags_are_usage_errors_before_any_traffic(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "control", *args]) == 2
    assert message in capsys.readouterr().err
