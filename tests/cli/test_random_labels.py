"""DEMO wherever random weights serve (issue 29 item 3): checkpoints written by the project's own
``cascade make-tiny`` and served or measured WITHOUT ``--demo`` are labelled as ``--demo`` labels
(answer model, ``x-cascade-demo``, ``/health``, ``cascade_build_info``, the boot log), and every
command that runs or measures tiers says DEMO on stderr and in what it writes. The same
checkpoint without the marker is never labelled."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port, wait_http

CASCADE = Path(sys.executable).parent / "cascade"
ANGER = {
    "anger": {
        "type": "score",
        "instructions": "How angry?",
        "criteria": ["calm", "upset", "furious"],
    }
}
BANNER = "DEMO: tiny RANDOM weights"


@dataclass(frozen=True)
class Tiny:
    laya: Path  # make-tiny laya
    clef: Path  # make-tiny clef
    real: Path  # the tiny Laya with its marker taken out: stands for real weights
    policy: Path  # both random tiers
    real_policy: Path  # the unmarked Laya alone
    data: Path  # labelled requests (eval, calibrate, route, distill)


def _policy(path: Path, laya: Path, clef: Path | None) -> Path:
    text = f'[tiers.laya]\nkind = "laya"\ncheckpoints = {{ english = "{laya}" }}\n'
    if clef is not None:
        text += f'[tiers.clef]\nkind = "clef"\nrelease = "{clef}"\ndevice = "cpu"\n'
    text += '[models]\ncascade = ["jev-latest"]\ncheap_only = ["laya"]\n' + (
        'strong_only = ["clef-flash"]\n[route]\ncheap = "laya"\nstrong = "clef"\n'
        if clef is not None
        else '[route]\ncheap = "laya"\n'
    )
    path.write_text(text)
    return path


def _data(path: Path, n: int) -> Path:
    rng = random.Random(3)
    teams = {"billing": "Payments", "tech": "Bugs", "sales": "Sales"}
    lines = []
    for i in range(n):
        state = f"ticket {i}: " + " ".join(
            rng.choice(["refund", "crash", "price", "login"]) for _ in range(6)
        )
        questions = {
            "urgent": {"type": "noul", "instructions": "Is it urgent?"},
            "team": {"type": "choice", "instructions": "Which team?", "criteria": teams},
            **ANGER,
        }
        gold = {
            "urgent": rng.random() < 0.5,
            "team": rng.choice(list(teams)),
            "anger": rng.choice(ANGER["anger"]["criteria"]),
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


def _env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.startswith("CASCADE_") or k == "CASCADE_CACHE"
    }


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    root = tmp_path_factory.mktemp("random-labels")
    for kind in ("laya", "clef"):
        subprocess.run(
            [str(CASCADE), "make-tiny", kind, str(root / kind)],
            check=True,
            env=_env(),
            capture_output=True,
        )
    real = root / "real"
    shutil.copytree(root / "laya", real)
    config = json.loads((real / "rl_agent_config.json").read_text())
    (real / "rl_agent_config.json").write_text(json.dumps(config | {"model_name": "english"}))
    return Tiny(
        laya=root / "laya",
        clef=root / "clef",
        real=real,
        policy=_policy(root / "policy.toml", root / "laya", root / "clef"),
        real_policy=_policy(root / "real.toml", real, None),
        data=_data(root / "data.jsonl", 40),
    )


class Served:
    def __init__(self, url: str, log: str) -> None:
        self.url, self.log = url, log

    def answer(self) -> httpx.Response:
        return httpx.post(
            self.url + "/v1/systemone",
            timeout=120,
            json={"model": "jev-latest", "state": "hello", "questions": ANGER},
        )


@contextlib.contextmanager
def serving(args: list[str], log: Path) -> Iterator[Served]:
    """``cascade ARGS --port N`` on loopback until it is ready; stopped afterwards."""
    url = f"http://127.0.0.1:{free_port()}"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(CASCADE), *args, "--port", url.rsplit(":", 1)[1]],
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_http(url + "/health", timeout_s=300, proc=proc)
            deadline = time.monotonic() + 300
            while httpx.get(url + "/ready").status_code != 200:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            yield Served(url, log)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _labels(served: Served) -> dict[str, object]:
    """Each place ``--demo`` labels, as this server shows it."""
    answer = served.answer()
    assert answer.status_code == 200, answer.text
    health = httpx.get(served.url + "/health").json()
    metrics = httpx.get(served.url + "/metrics").text
    build = next(line for line in metrics.splitlines() if line.startswith("cascade_build_info"))
    return {
        "model": answer.json()["model"].startswith("DEMO-random-weights/"),
        "body": answer.json()["x_cascade"].get("demo") is True,
        "header": "x-cascade-demo" in answer.headers,
        "health": health["demo"] is True and "warning" in health,
        "tiers": all(tier["demo"] for tier in health["tiers"].values()),
        "metrics": 'demo="true"' in build,
        "log": "DEMO MODE" in served.log.read_text()
        and "DEMO (random weights)" in served.log.read_text(),
    }


@pytest.mark.parametrize("entry", ["serve --laya", "serve --clef", "serve --policy", "engine clef"])
def test_serve_labels_random_weights_as_demo_does(entry: str, tiny: Tiny, tmp_path: Path) -> None:
    """Before: ``model`` "english", ``demo: false`` everywhere, nothing in the log."""
    args = {
        "serve --laya": ["serve", "--laya", str(tiny.laya)],
        "serve --clef": ["serve", "--clef", str(tiny.clef)],
        "serve --policy": ["serve", "--policy", str(tiny.policy)],
        "engine clef": ["engine", "clef", "--checkpoint", str(tiny.clef)],
    }[entry]
    with serving(args, tmp_path / "serve.log") as served:
        labels = _labels(served)
    assert labels == dict.fromkeys(labels, True), labels


def test_serve_does_not_label_weights_without_the_marker(tiny: Tiny, tmp_path: Path) -> None:
    with serving(["serve", "--laya", str(tiny.real)], tmp_path / "serve.log") as served:
        labels = _labels(served)
        answer = served.answer().json()
    assert labels == dict.fromkeys(labels, False), labels
    assert answer["model"] == "english"


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CASCADE), *map(str, args)], env=_env(), capture_output=True, text=True, timeout=600
    )


def _last_json(stdout: str) -> dict:
    """The JSON object the command printed (``bench laya`` prints a table: then {})."""
    return next(
        (json.loads(line) for line in reversed(stdout.splitlines()) if line.startswith("{")), {}
    )


def _written(path: Path) -> dict:
    return json.loads(path.read_text())


COMMANDS = [
    "eval",
    "eval --url",
    "calibrate",
    "distill",
    "route",
    "bench laya",
    "bench clef",
    "bench load",
    "bench soak",
    "bench tenants",
    "bench control",
]


@pytest.fixture(scope="module")
def random_server(tiny: Tiny, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway on the tiny random Laya (``--laya``, no ``--demo``), for the benches that
    drive a running server."""
    log = tmp_path_factory.mktemp("random-server") / "serve.log"
    with serving(["serve", "--laya", str(tiny.laya)], log) as served:
        yield served.url


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_prints_and_writes_the_label(
    command: str, tiny: Tiny, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each command on random tiers (none with ``--demo``): a DEMO banner on stderr, and the
    label in its JSON and in the files it writes. Before: nothing said DEMO."""
    out, report = tmp_path / "out", tmp_path / "report.json"
    url = (
        request.getfixturevalue("random_server")
        if command.startswith(("bench load", "bench soak", "bench tenants", "bench control"))
        or "--url" in command
        else ""
    )
    args: list[str | Path] = {
        "eval": [
            "eval",
            tiny.data,
            "--policy",
            tiny.policy,
            "--out",
            out,
            "--no-progress",
            "--json",
        ],
        "eval --url": [
            "eval",
            tiny.data,
            "--url",
            url,
            "--model",
            "laya",
            "--out",
            out,
            "--no-progress",
            "--json",
        ],
        "calibrate": [
            "calibrate",
            tiny.data,
            "--policy",
            tiny.policy,
            "--out",
            out,
            "--target-escalation",
            "0.3",
            "--min-cell",
            "5",
            "--no-progress",
            "--json",
        ],
        "distill": [
            "distill",
            tiny.data,
            "--policy",
            tiny.policy,
            "--out",
            out,
            "--run-dir",
            tmp_path / "run",
            "--epochs",
            "1",
            "--no-progress",
            "--json",
        ],
        "route": ["route", tiny.data, "--policy", tiny.policy, "--json"],
        "bench laya": [
            "bench",
            "laya",
            "--shape",
            "tiny",
            "--repeat",
            "1",
            "--requests",
            "2",
            "--clients",
            "1",
            "--json",
            report,
        ],
        "bench clef": [
            "bench",
            "clef",
            "--shape",
            "tiny",
            "--release",
            tiny.clef,
            "--device",
            "cpu",
            "--tokens",
            "64",
            "--repeats",
            "1",
            "--requests",
            "2",
            "--concurrency",
            "1",
            "--json",
            report,
        ],
        "bench load": [
            "bench",
            "load",
            "--url",
            url,
            "--duration",
            "1",
            "--concurrency",
            "1",
            "--model",
            "laya",
            "--json",
            report,
        ],
        "bench soak": [
            "bench",
            "soak",
            "--url",
            url,
            "--duration",
            "1",
            "--window",
            "1",
            "--honest",
            "1",
            "--json",
            report,
        ],
        "bench tenants": [
            "bench",
            "tenants",
            "--url",
            url,
            "--quiet-key",
            "q",
            "--flood-key",
            "f",
            "--requests",
            "2",
            "--rate",
            "2",
            "--json",
            report,
        ],
        "bench control": [
            "bench",
            "control",
            "--url",
            url,
            "--phase-duration",
            "1",
            "--concurrency",
            "1",
            "--window",
            "1",
            "--scrape-every",
            "0.5",
            "--plot",
            tmp_path / "control.png",
            "--json",
            report,
        ],
    }[command]
    done = _run(*args)
    assert done.returncode in ((0, 1) if command == "distill" else (0,)), done.stderr[-3000:]
    assert f"cascade {command.split(' --')[0]}: {BANNER}" in done.stderr, done.stderr[-3000:]
    printed = _last_json(done.stdout)
    assert printed.get("demo") is (None if command == "bench laya" else True), printed
    written = {
        "eval": lambda: _written(out / "summary.json"),
        "eval --url": lambda: _written(out / "summary.json"),
        "calibrate": lambda: {"demo": "DEMO: fitted on tiny random weights" in out.read_text()},
        "distill": lambda: _written(tmp_path / "run" / "distill.json"),
        "route": lambda: printed,  # route writes nothing but what it prints
    }.get(command, lambda: _written(report))()
    assert written["demo"] is True and written.get("random_tiers", command == "calibrate"), written
    if command == "eval":
        assert "DEMO" in (out / "summary.md").read_text()


@pytest.mark.parametrize("command", ["eval", "route"])
def test_commands_do_not_label_weights_without_the_marker(
    command: str, tiny: Tiny, tmp_path: Path
) -> None:
    args: list[str | Path] = (
        [
            "eval",
            tiny.data,
            "--policy",
            tiny.real_policy,
            "--out",
            tmp_path / "out",
            "--no-progress",
            "--json",
        ]
        if command == "eval"
        else ["route", tiny.data, "--policy", tiny.real_policy, "--json"]
    )
    done = _run(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "DEMO" not in done.stderr
    printed = _last_json(done.stdout)
    assert not printed.get("demo") and "random_tiers" not in printed, printed


def test_the_marker_is_read_from_every_format(tiny: Tiny, tmp_path: Path) -> None:
    """A make-tiny Laya checkpoint and Clef release, their fp32 and int8 ONNX exports, and a
    Clef release make-tiny wrote before the marker; never the unmarked checkpoint or its
    exports."""
    from cascade.build import random_weights
    from cascade.laya.export import export
    from cascade.laya.int8 import export_int8

    fp32, int8 = export(tiny.laya, progress=str), export_int8(tiny.laya, progress=str)
    real_fp32 = export(tiny.real, progress=str)
    old_clef = tmp_path / "old-clef"
    shutil.copytree(tiny.clef, old_clef)
    config = json.loads((old_clef / "config.json").read_text())
    del config["model_name"]
    (old_clef / "config.json").write_text(json.dumps(config))
    assert [random_weights(p) for p in (tiny.laya, tiny.clef, fp32, int8, old_clef)] == [True] * 5
    assert [random_weights(p) for p in (tiny.real, real_fp32, tmp_path)] == [False] * 3
