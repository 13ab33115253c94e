"""What calibrate, eval and distill print: a short rounded table (``--json`` for machines), and
progress bars only when stderr is a terminal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cascade.cli import main
from tests.learn.generate import write

ROOT = Path(__file__).parents[2]
LONG_FLOAT = re.compile(r"\d\.\d{5,}")


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cascade.clef.tiny import make_tiny as make_clef
    from cascade.laya.tiny import make_tiny as make_laya

    root = tmp_path_factory.mktemp("demo")
    make_laya(root / "laya-english")
    make_clef(root / "clef-flash")
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("data") / "requests.jsonl", 40, seed=3)


def cascade(demo_dir: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """``cascade ...`` with stdout and stderr going to pipes, not a terminal."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CASCADE_DEMO_DIR": str(demo_dir)}
    return subprocess.run(
        [sys.executable, "-m", "cascade", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_calibrate_prints_a_short_rounded_table_and_json_on_request(
    demo_dir: Path,
    data: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CASCADE_DEMO_DIR", str(demo_dir))
    args = [
        "calibrate",
        str(data),
        "--demo",
        "--out",
        str(tmp_path / "cal.toml"),
        "--target-escalation",
        "0.3",
        "--min-cell",
        "10",
        "--cache",
        str(tmp_path / "c"),
    ]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert len(table) < 1200 and len(table.splitlines()) < 20, table
    assert not LONG_FLOAT.search(table), table
    assert table.splitlines()[1].split() == [
        "cell",
        "n",
        "threshold",
        "temp",
        "escalate",
        "kept",
        "acc",
        "95%",
        "low",
    ]
    assert main([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["target"] == "escalation" and summary["cells"]
    assert not LONG_FLOAT.search(json.dumps(summary))
    assert {
        name.removesuffix(" *")
        for name in (line.split()[0] for line in table.splitlines()[2:])
        if ":" in name
    } == set(summary["cells"])


def test_eval_prints_a_table_without_progress_bars_into_a_file(
    demo_dir: Path, data: Path, tmp_path: Path
) -> None:
    run = cascade(demo_dir, "eval", data, "--demo", "--out", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    assert "\r" not in run.stderr and "item/s" not in run.stderr, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1].split() == ["tier", "n", "accuracy", "macro", "F1", "ECE", "escalated"]
    assert [line.split()[0] for line in lines[2:]] == ["cheap", "strong", "cascade"]
    assert not LONG_FLOAT.search(run.stdout)
    as_json = cascade(demo_dir, "eval", data, "--demo", "--out", tmp_path / "out", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["questions"] == int(lines[0].split()[0])


def test_distill_writes_no_progress_bars_into_a_file(
    demo_dir: Path, data: Path, tmp_path: Path
) -> None:
    run = cascade(
        demo_dir,
        "distill",
        data,
        "--demo",
        "--out",
        tmp_path / "new",
        "--run-dir",
        tmp_path / "run",
        "--epochs",
        "1",
    )
    assert run.returncode in (0, 1), run.stderr  # written, or refused (no improvement)
    assert "\r" not in run.stderr and "distill: t" not in run.stderr, run.stderr
    assert "agreement" in run.stdout and not LONG_FLOAT.search(run.stdout)
