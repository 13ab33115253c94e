"""deploy/systemd: ``systemd-analyze verify`` accepts both units.

verify checks that ExecStart's program exists; on a machine without /opt/cascade the units are
copied to a temporary directory with that prefix pointed at this test's own virtualenv (which
has ``cascade`` and ``python``), and nothing else changed. verify reports bad directives as
warnings with exit status 0, so any output about the units fails the test; a deliberately
broken copy shows that check can fail.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.deploy import promql
from tests.servers import require_tool

SYSTEMD = promql.DEPLOY / "systemd"
UNITS = ("cascade-gateway.service", "cascade-clef.service")
PREFIX = "/opt/cascade/.venv/bin/"


def verify(tmp_path: Path, edit: dict[str, str] | None = None) -> str:
    """The units, with ExecStart's venv moved to ours, through ``systemd-analyze verify``."""
    paths = []
    for unit in UNITS:
        text = (SYSTEMD / unit).read_text()
        assert PREFIX in text
        text = text.replace(PREFIX, str(Path(sys.executable).parent) + "/")
        for old, new in (edit or {}).items():
            text = text.replace(old, new)
        (tmp_path / unit).write_text(text)
        paths.append(str(tmp_path / unit))
    result = subprocess.run([require_tool("systemd-analyze"), "verify", *paths],
                            capture_output=True, text=True, timeout=60)
    out = (result.stdout + result.stderr).strip()
    return out or (f"exit status {result.returncode}" if result.returncode else "")


def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path) -> None:
    assert verify(tmp_path) == ""


def test_verify_reports_a_bad_directive(tmp_path: Path) -> None:
    out = verify(tmp_path, {"ProtectSystem=strict": "ProtectSystem=sometimes"})
    assert "Failed to parse protect system value" in out


def directives(unit: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in (SYSTEMD / unit).read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def minutes(value: str) -> float:
    match = re.fullmatch(r"(\d+)(min|s)", value)
    assert match, value
    return int(match.group(1)) / (60 if match.group(2) == "s" else 1)


def test_units_load_models_restart_and_are_hardened() -> None:
    for unit in UNITS:
        d = directives(unit)
        assert minutes(d["TimeoutStartSec"][0]) >= 15, unit  # model loading
        assert d["Restart"] == ["on-failure"] and d["EnvironmentFile"][0].startswith("/etc/")
        assert "/ready" in d["ExecStartPost"][0]  # start completes when the server is ready
        for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                           ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                           ("CapabilityBoundingSet", ""), ("RestrictNamespaces", "yes")):
            assert d[key] == [value], (unit, key)
        assert d["User"] == ["cascade"]
    assert directives("cascade-gateway.service")["PrivateDevices"] == ["yes"]
    assert "PrivateDevices" not in directives("cascade-clef.service")  # it needs the GPU


def test_environment_files_set_only_documented_variables() -> None:
    """Every CASCADE_* variable in the example environment files is in the README's table."""
    readme = (promql.REPO / "README.md").read_text()
    for name in ("gateway.env", "clef.env"):
        for line in (SYSTEMD / name).read_text().splitlines():
            if line and not line.startswith("#"):
                key = line.split("=", 1)[0]
                if key.startswith("CASCADE_"):
                    assert f"`{key}`" in readme, (name, key)
