"""Mistakes a user can make on the command line: each is one or a few lines naming the file,
flag, variable or port, exit status 2 (usage) or 1 (configuration), and never a traceback.

Every command runs as a subprocess, as a user runs it (``python -m cascade``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
BAD_POLICY = """\
[tiers.laya]
kind = "laya"
checkpionts = { english = "./tiny" }
"""


def cascade(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}
    environ |= {"PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "cascade", *args],
        capture_output=True,
        text=True,
        env=environ,
        cwd=cwd,
        timeout=timeout,
    )


def refused(run: subprocess.CompletedProcess[str], status: int, *named: str) -> str:
    """The output of a refused command, checked: its status, no traceback, the named things."""
    out = run.stdout + run.stderr
    assert run.returncode == status, out
    assert "Traceback" not in out, out
    for thing in named:
        assert thing in out, (thing, out)
    assert len(out.strip().splitlines()) <= 20, out
    return out


@pytest.fixture()
def bad_policy(tmp_path: Path) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(BAD_POLICY)
    return path


@pytest.fixture()
def demo_dir(tmp_path: Path) -> Path:
    """A demo directory that is still empty: if the demo's weights were made or loaded, it
    would not be."""
    return tmp_path / "demo"


def test_serve_prints_the_policy_findings_policy_check_prints(bad_policy: Path) -> None:
    checked = cascade("policy", "check", str(bad_policy))
    findings = [line for line in checked.stdout.splitlines() if ": error: " in line]
    assert f"{bad_policy}:3: error: unknown key `checkpionts`" in checked.stdout
    out = refused(cascade("serve", "--policy", str(bad_policy)), 1, *findings)
    assert sorted(out.strip().splitlines()) == sorted(findings)


def test_debug_log_level_keeps_the_traceback(bad_policy: Path) -> None:
    run = cascade("serve", "--policy", str(bad_policy), "--log-level", "debug")
    assert run.returncode == 1
    assert "Traceback" in run.stderr and "PolicyError" in run.stderr


@pytest.mark.parametrize(
    ("args", "status", "named"),
    [
        (["serve", "--laya", "/nonexistent"], 1, ["/nonexistent"]),
        (["serve", "--clef", "/nonexistent"], 1, ["/nonexistent"]),
        (["serve", "--demo", "--log-level", "verbose"], 2, ["--log-level", "verbose"]),
        (["serve", "--demo", "--port", "99999"], 2, ["--port", "99999"]),
        (["serve", "--demo", "--profile", "fast"], 2, ["--profile", "fast"]),
        (["serve", "--calibration", "/missing.toml", "--demo"], 1, ["/missing.toml"]),
        (["engine", "clef", "--checkpoint", "/nonexistent"], 1, ["/nonexistent"]),
        (["export", "laya", "/nonexistent"], 1, ["/nonexistent"]),
        (["policy", "check", "/missing.toml"], 1, ["/missing.toml"]),
        (["route", "/missing.jsonl", "--policy", "/missing.toml"], 1, ["/missing.toml"]),
        (["eval", "/missing.jsonl", "--demo", "--out", "OUT"], 1, ["/missing.jsonl"]),
        (["eval", "data.jsonl", "--out", "OUT"], 2, ["--policy", "--demo"]),
        (["eval", "data.jsonl", "--demo", "--out", "OUT", "--cost", "laya"], 2, ["--cost"]),
        (
            [
                "calibrate",
                "/missing.jsonl",
                "--demo",
                "--out",
                "c.toml",
                "--target-escalation",
                "0.3",
            ],
            1,
            ["/missing.jsonl"],
        ),
        (
            ["calibrate", "data.jsonl", "--demo", "--out", "c.toml", "--target-escalation", "3"],
            2,
            ["target", "3"],
        ),
        (["distill", "/missing.jsonl", "--demo", "--out", "new"], 2, ["/missing.jsonl"]),
        (
            ["bench", "load", "--url", "http://127.0.0.1:9", "--repeat-share", "2"],
            2,
            ["--repeat-share", "2"],
        ),
        (
            ["bench", "load", "--url", "http://127.0.0.1:9", "--duration", "1"],
            1,
            ["--url http://127.0.0.1:9", "start the server"],
        ),
        (["bench", "laya", "--sample", "/missing.jsonl"], 1, ["--sample", "/missing.jsonl"]),
        (["bench", "clef", "--shape", "tiny", "--tokens", "many"], 2, ["--tokens", "many"]),
        (["completion", "fish"], 2, ["fish", "bash"]),
    ],
)
def test_a_mistake_is_a_few_lines_naming_it(
    args: list[str], status: int, named: list[str], tmp_path: Path, demo_dir: Path
) -> None:
    (tmp_path / "data.jsonl").write_text('{"id": "1", "state": "hi", "questions": {}}\n')
    refused(
        cascade(
            *args,
            env={
                "CASCADE_DEMO_DIR": str(demo_dir),
                "HF_HUB_OFFLINE": "1",
                "HF_HUB_CACHE": str(tmp_path / "hub"),
            },
            cwd=tmp_path,
        ),
        status,
        *named,
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("CASCADE_PORT", "abc"),
        ("CASCADE_PORT", "70000"),
        ("CASCADE_LOG_LEVEL", "verbose"),
        ("CASCADE_PROFILE", "fast"),
        ("CASCADE_MAX_INFLIGHT", "many"),
        ("CASCADE_DEMO", "maybe"),
    ],
)
def test_a_bad_environment_value_names_its_variable(
    variable: str, value: str, demo_dir: Path
) -> None:
    env = {"CASCADE_DEMO": "1", variable: value, "CASCADE_DEMO_DIR": str(demo_dir)}
    out = refused(cascade("serve", env=env), 1, f"{variable}={value}")
    assert "$." not in out  # not msgspec's JSON path
    assert not demo_dir.exists()


def test_a_missing_keys_file_is_reported_before_anything_loads(demo_dir: Path) -> None:
    refused(
        cascade(
            "serve",
            "--demo",
            env={"CASCADE_API_KEYS_FILE": "/missing/keys", "CASCADE_DEMO_DIR": str(demo_dir)},
        ),
        1,
        "CASCADE_API_KEYS_FILE=/missing/keys",
    )
    assert not demo_dir.exists()


@pytest.mark.slow
def test_a_taken_port_is_reported_at_once_and_nothing_is_loaded(demo_dir: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        start = time.monotonic()
        out = refused(
            cascade(
                "serve", "--demo", "--port", str(port), env={"CASCADE_DEMO_DIR": str(demo_dir)}
            ),
            1,
            f"port {port}",
            "--port",
            "CASCADE_PORT",
            "Nothing was loaded",
        )
        elapsed = time.monotonic() - start
    assert "DEMO MODE" not in out
    assert not demo_dir.exists()  # the demo's tiny checkpoints were never written
    assert elapsed < 10, elapsed  # python's start-up; loading the demo takes longer
