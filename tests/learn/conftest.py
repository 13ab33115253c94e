"""The demo tiers on tiny checkpoints, generated requests, and one distillation run of them."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import msgspec
import pytest

from cascade.cli import main
from cascade.learn.distill import Report
from tests.learn.generate import write

REQUESTS = 160
EPOCHS = "8"


class Run(msgspec.Struct):
    code: int
    stdout: str
    stderr: str
    out: Path
    run_dir: Path


def distill(demo_dir: Path, *args: str | Path) -> Run:
    """``cascade distill ... --demo`` in process, the demo tiers read from ``demo_dir``."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["distill", *map(str, args), "--no-progress"]
    with (
        pytest.MonkeyPatch.context() as env,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        env.setenv("CASCADE_DEMO_DIR", str(demo_dir))
        code = main(argv)
    flag = argv.index("--out") + 1
    run_dir = argv[argv.index("--run-dir") + 1] if "--run-dir" in argv else ""
    return Run(code, out.getvalue(), err.getvalue(), Path(argv[flag]), Path(run_dir))


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny checkpoints, written where ``cascade --demo`` looks for them."""
    from cascade.clef.tiny import make_tiny as make_clef
    from cascade.laya.tiny import make_tiny as make_laya

    root = tmp_path_factory.mktemp("demo")
    make_laya(root / "laya-english")
    make_clef(root / "clef-flash")
    return root


@pytest.fixture(scope="session")
def requests_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("requests") / "requests.jsonl", REQUESTS, seed=1)


@pytest.fixture(scope="session")
def distilled(demo_dir: Path, requests_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("distilled")
    return distill(
        demo_dir,
        requests_file,
        "--demo",
        "--out",
        root / "new",
        "--run-dir",
        root / "run",
        "--epochs",
        EPOCHS,
    )


def report_of(run: Run) -> Report:
    meta = msgspec.json.decode((run.run_dir / "distill.json").read_bytes())
    return Report(written=run.out.exists(), out=run.out, run_dir=run.run_dir, meta=meta)
