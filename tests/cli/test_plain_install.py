"""The plain install (``pip install cascade-router``, no extras) serves ``--upstream`` and a
pre-exported Laya ONNX, and a command that needs an extra names it in one line.

The gateways run as subprocesses in which every package of the extras (``cascade.errors``)
fails to import, as on a machine that never installed them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from cascade.errors import EXTRAS
from cascade.laya.export import export
from cascade.laya.tiny import make_tiny
from tests.cli.test_errors import cascade, refused
from tests.servers import free_port, run_process

ROOT = Path(__file__).parents[2]
BLOCKER = f"""\
import sys

BLOCKED = {sorted(EXTRAS)!r}


class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, Blocker())
"""
QUESTION = {
    "model": "jev-latest",
    "state": "I was charged twice",
    "questions": {"ok": {"type": "noul", "instructions": "Is the customer calm?"}},
}


@pytest.fixture()
def plain(tmp_path: Path) -> dict[str, str]:
    """The environment of a plain install: the extras' packages cannot be imported."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}
    return environ | {
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
        "CASCADE_CACHE": os.environ["CASCADE_CACHE"],
    }


def test_a_plain_install_serves_a_pre_exported_laya_behind_an_upstream(
    plain: dict[str, str], tmp_path: Path
) -> None:
    ckpt = make_tiny(tmp_path / "laya")
    export(ckpt, progress=lambda _: None)  # the export extra, here; serving needs none
    laya_port, gateway_port = free_port(), free_port()
    laya = [sys.executable, "-m", "cascade", "serve", "--laya", str(ckpt), "--port", str(laya_port)]
    gateway = [
        sys.executable,
        "-m",
        "cascade",
        "serve",
        "--port",
        str(gateway_port),
        "--upstream",
        f"http://127.0.0.1:{laya_port}",
    ]
    with (
        run_process(laya, ready_url=f"http://127.0.0.1:{laya_port}/health", env=plain),
        run_process(gateway, ready_url=f"http://127.0.0.1:{gateway_port}/health", env=plain),
    ):
        answer = httpx.post(
            f"http://127.0.0.1:{gateway_port}/v1/systemone", json=QUESTION, timeout=30
        )
    assert answer.status_code == 200, answer.text
    assert 0.0 <= answer.json()["answers"]["ok"]["noul"] <= 1.0


@pytest.mark.parametrize(
    ("args", "package", "extra"),
    [
        (["make-tiny", "clef"], "torch", "export"),
        (["export", "laya"], "onnx", "export"),
    ],
)
def test_a_missing_extra_is_named_with_the_distribution(
    args: list[str], package: str, extra: str, plain: dict[str, str], tmp_path: Path
) -> None:
    target = tmp_path / "target"
    if args[0] == "export":
        target = make_tiny(tmp_path / "laya")
    out = refused(
        cascade(*args, str(target), env=plain),
        1,
        f"{package} is not installed",
        f"pip install 'cascade-router[{extra}]'",
    )
    assert len(out.strip().splitlines()) == 1, out


def test_serving_a_laya_with_no_export_on_a_plain_install_says_which_extra(
    plain: dict[str, str], tmp_path: Path
) -> None:
    """The export runs at start-up, in the app: its refusal is the command's one error (exit 1),
    not uvicorn's traceback of the app's start-up."""
    ckpt = make_tiny(tmp_path / "laya")
    fresh = plain | {"CASCADE_CACHE": str(tmp_path / "cache")}  # no export another test made
    out = refused(
        cascade("serve", "--laya", str(ckpt), "--port", str(free_port()), env=fresh),
        1,
        "cascade serve: error: the gateway did not start: ONNX export of",
        "pip install 'cascade-router[export]'",
    )
    assert "Traceback" not in out and "Exception Group" not in out, out
