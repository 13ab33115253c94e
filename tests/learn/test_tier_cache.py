"""eval and distill share one tier cache keyed by the tier's content: a Clef release retrained
in place is asked again by both, an unchanged one never; a repeated id is an error naming the
line in both CLIs."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from pathlib import Path

import pytest

from cascade.build import demo_policy
from cascade.cli import main
from cascade.cli.distill import CANNOT_START
from cascade.eval.data import read_items
from cascade.eval.evaluate import run_tiers
from cascade.learn import distill
from cascade.settings import Settings
from tests.learn.conftest import distill as distill_cli

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "team": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": ["billing", "tech", "sales"],
    },
}


def _requests(path: Path, states: list[str], ids: list[str] | None = None) -> Path:
    ids = ids or [f"r{i}" for i in range(len(states))]
    path.write_text(
        "".join(
            json.dumps({"id": i, "state": s, "questions": QUESTIONS}) + "\n"
            for i, s in zip(ids, states, strict=True)
        )
    )
    return path


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines())


def test_a_clef_release_retrained_in_place_is_asked_again_by_eval_and_distill(
    tmp_path: Path,
) -> None:
    from cascade.clef.tiny import make_tiny as make_clef
    from cascade.laya.tiny import make_tiny as make_laya

    root = tmp_path / "demo"
    make_laya(root / "laya-english")
    make_clef(root / "clef-flash", seed=0)
    settings = Settings(demo=True, demo_dir=str(root))
    policy = demo_policy(root, settings)
    states = ["refund my invoice now", "the app crashes at login", "what does it cost?"]
    items, _ = read_items(_requests(tmp_path / "r.jsonl", states), model="jev-latest")
    out, run_dir = tmp_path / "eval", tmp_path / "distill-run"
    options = distill.DistillOptions(settings=settings, out=tmp_path / "new", progress=False)
    cheap, strong, taught = (
        out / "cache/cheap.jsonl",
        out / "cache/strong.jsonl",
        run_dir / "teacher.jsonl",
    )

    def both() -> dict[str, list[float]]:
        asyncio.run(
            run_tiers(items, policy, settings, out, slots=["cheap", "strong"], progress=False)
        )
        run_dir.mkdir(exist_ok=True)
        (first, *_) = distill._teach(options, policy, items, run_dir)
        assert first.teacher is not None
        return first.teacher

    before, teacher_before = both(), distill.teacher_identity(policy)
    assert (_lines(cheap), _lines(strong), _lines(taught)) == (3, 3, 3)
    assert both() == before  # unchanged weights: every answer from the caches
    assert (_lines(cheap), _lines(strong), _lines(taught)) == (3, 3, 3)

    make_clef(root / "clef-flash", seed=1)  # retrained in place: same path, new weights
    after = both()
    assert (_lines(cheap), _lines(strong), _lines(taught)) == (3, 6, 6)  # Laya unchanged
    assert after != before
    assert distill.teacher_identity(policy)["identity"] != teacher_before["identity"]
    assert distill.teacher_identity(policy)["release"] == teacher_before["release"]


def test_eval_refuses_a_repeated_id_naming_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_DEMO_DIR", str(tmp_path / "demo"))
    data = _requests(tmp_path / "r.jsonl", ["one", "two", "three"], ids=["a", "b", "a"])
    err = io.StringIO()
    with pytest.raises(SystemExit) as refused, contextlib.redirect_stderr(err):
        main(["eval", str(data), "--demo", "--out", str(tmp_path / "out"), "--no-progress"])
    assert str(refused.value) == (
        f"cascade eval: {data}:3: duplicate id 'a' (first on line 1);"
        " every item needs a unique `id`"
    )


def test_distill_refuses_a_repeated_id_naming_its_line(demo_dir: Path, tmp_path: Path) -> None:
    data = _requests(tmp_path / "r.jsonl", ["one", "two", "three"], ids=["a", "b", "a"])
    run = distill_cli(demo_dir, data, "--demo", "--out", tmp_path / "new")
    assert run.code == CANNOT_START
    assert f"{data}:3: duplicate id 'a' (first on line 1)" in run.stderr
    assert not run.out.exists()
