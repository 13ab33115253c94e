"""The acceptance check in small: ``cascade eval --demo --laya NEWDIR`` on requests distil never
saw shows the cheap tier agreeing with the strong tier on far more questions."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from cascade.cli import main
from tests.learn.conftest import Run
from tests.learn.generate import write


def agreement(out: Path) -> float:
    """summary.json's cheap-strong agreement, checked against its items.jsonl."""
    rows = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    both = [r for r in rows if r["cheap"] and r["strong"]]
    assert len(both) >= 60
    share = sum(r["cheap"]["answer"] == r["strong"]["answer"] for r in both) / len(both)
    reported = json.loads((out / "summary.json").read_text())["agreement"]
    assert reported["questions"] == len(both) and reported["cheap_strong"] == share
    return share


def evaluate(demo_dir: Path, data: Path, out: Path, *laya: str | Path) -> float:
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(io.StringIO()):
        env.setenv("CASCADE_DEMO_DIR", str(demo_dir))
        assert (
            main(["eval", str(data), "--demo", *map(str, laya), "--out", str(out), "--no-progress"])
            == 0
        )
    return agreement(out)


def test_eval_of_newdir_agrees_with_the_strong_tier_far_more(
    distilled: Run, demo_dir: Path, tmp_path: Path
) -> None:
    unseen = write(tmp_path / "unseen.jsonl", 60, seed=7)
    before = evaluate(demo_dir, unseen, tmp_path / "before")
    after = evaluate(demo_dir, unseen, tmp_path / "after", "--laya", distilled.out)
    assert after >= before + 0.15, (before, after)
