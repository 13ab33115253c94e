"""deploy/systemd: ``install.sh`` into a temporary root (DESTDIR) creates every path the
installed units, env files and policy name, and ``systemd-analyze verify`` accepts the units,
as shipped and as installed.

verify checks that ExecStart's program exists; on a machine without /opt/cascade the units are
copied to a temporary directory with that prefix pointed at this test's own virtualenv (which
has ``cascade`` and ``python``), and nothing else changed. verify reports bad directives as
warnings with exit status 0, so any output about the units fails the test; a deliberately
broken copy shows that check can fail.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.deploy import promql
from tests.servers import require_tool

SYSTEMD = promql.DEPLOY / "systemd"
UNITS = ("cascade-gateway.service", "cascade-clef.service")
PREFIX = "/opt/cascade/.venv/bin/"


def verify(tmp_path: Path, edit: dict[str, str] | None = None, units: Path = SYSTEMD) -> str:
    """The units in ``units``, with ExecStart's venv moved to ours, through
    ``systemd-analyze verify``."""
    paths = []
    for unit in UNITS:
        text = (units / unit).read_text()
        assert PREFIX in text
        text = text.replace(PREFIX, str(Path(sys.executable).parent) + "/")
        for old, new in (edit or {}).items():
            text = text.replace(old, new)
        (tmp_path / unit).write_text(text)
        paths.append(str(tmp_path / unit))
    result = subprocess.run(
        [require_tool("systemd-analyze"), "verify", *paths],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = (result.stdout + result.stderr).strip()
    return out or (f"exit status {result.returncode}" if result.returncode else "")


def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path) -> None:
    assert verify(tmp_path) == ""


def test_verify_reports_a_bad_directive(tmp_path: Path) -> None:
    out = verify(tmp_path, {"ProtectSystem=strict": "ProtectSystem=sometimes"})
    assert "Failed to parse protect system value" in out


def directives(unit: str, units: Path = SYSTEMD) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in (units / unit).read_text().splitlines():
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
        for key, value in (
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("ProtectHome", "yes"),
            ("PrivateTmp", "yes"),
            ("CapabilityBoundingSet", ""),
            ("RestrictNamespaces", "yes"),
        ):
            assert d[key] == [value], (unit, key)
        assert d["User"] == ["cascade"]
    assert directives("cascade-gateway.service")["PrivateDevices"] == ["yes"]
    assert "PrivateDevices" not in directives("cascade-clef.service")  # it needs the GPU


def test_environment_files_set_only_documented_variables() -> None:
    """Every CASCADE_* variable in the example environment files is in docs/configuration.md's
    table."""
    readme = (promql.REPO / "docs" / "configuration.md").read_text()
    for name in ("gateway.env", "clef.env"):
        for line in (SYSTEMD / name).read_text().splitlines():
            if line and not line.startswith("#"):
                key = line.split("=", 1)[0]
                if key.startswith("CASCADE_"):
                    assert f"`{key}`" in readme, (name, key)


INSTALL = SYSTEMD / "install.sh"
VENV = Path(sys.executable).parent.parent
MODELS = "/var/lib/cascade/models"
# Paths the units name that the host's own system provides.
SYSTEM = ("/bin/", "/usr/")


def install(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``install.sh`` with DESTDIR=root (so no useradd, chown or systemctl on this machine)."""
    result = subprocess.run(
        ["sh", str(INSTALL)],
        env={**os.environ, "DESTDIR": str(root), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The staging root install.sh filled (with this test's virtualenv as PREFIX/.venv), and
    what it printed."""
    root = tmp_path_factory.mktemp("root")
    return root, install(root, VENV=str(VENV)).stdout


def env_file(path: Path) -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if line and not line.startswith("#")
    )
    return dict(pairs)


def expand(command: str, env: dict[str, str]) -> str:
    """``${NAME}`` in an Exec line replaced from the unit's environment files."""
    return re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], command)


def referenced(root: Path) -> set[str]:
    """Every absolute path the installed units, env files and policy name (variables
    expanded from the env files), without the host system's own programs."""
    units = root / "etc/systemd/system"
    paths: set[str] = set()
    for unit in UNITS:
        d = directives(unit, units)
        env: dict[str, str] = {}
        for value in d["EnvironmentFile"]:
            paths.add(value.lstrip("-"))
            env |= env_file(root / value.lstrip("-").lstrip("/"))
        paths |= {v.removeprefix("file://") for v in d["Documentation"]}
        for key in ("StateDirectory", "CacheDirectory"):
            base = {"StateDirectory": "/var/lib/", "CacheDirectory": "/var/cache/"}[key]
            paths |= {base + v for v in d[key]}
        for key in ("ExecStart", "ExecStartPost"):
            for command in d[key]:
                paths |= set(re.findall(r"(?:^|[\s'\"])(/[^\s'\"]+)", expand(command, env)))
        paths |= {v for v in env.values() if v.startswith("/")}
    policy = tomllib.loads((root / "etc/cascade/policy.toml").read_text())
    for tier in policy["tiers"].values():
        paths |= set(tier.get("checkpoints", {}).values())
    return {p for p in paths if not p.startswith(SYSTEM)}


def test_install_creates_every_path_the_units_name(installed: tuple[Path, str]) -> None:
    """Each path exists in the staging root, except the weights, which the operator downloads
    into the models directory the script creates and names in its next steps."""
    root, out = installed
    paths = referenced(root)
    assert {
        "/etc/cascade/gateway.env",
        "/etc/cascade/clef.env",
        "/etc/cascade/api-keys",
        "/etc/cascade/admin-keys",
        "/etc/cascade/policy.toml",
        "/opt/cascade/.venv/bin/cascade",
        "/opt/cascade/.venv/bin/python",
        "/var/lib/cascade",
        "/var/cache/cascade/hf",
        f"{MODELS}/laya",
        f"{MODELS}/clef-flash",
    } <= paths
    weights = {p for p in paths if p.startswith(MODELS + "/")}
    assert weights == {f"{MODELS}/laya", f"{MODELS}/laya/multilingual", f"{MODELS}/clef-flash"}
    missing = [p for p in sorted(paths - weights) if not (root / p.lstrip("/")).exists()]
    assert missing == []
    assert (root / MODELS.lstrip("/")).is_dir()
    for path in (f"{MODELS}/laya", f"{MODELS}/clef-flash"):
        assert f"--local-dir {path}" in out


def test_install_writes_a_random_key_readable_by_the_service_only(
    installed: tuple[Path, str], tmp_path: Path
) -> None:
    root, out = installed
    keys = root / "etc/cascade/api-keys"
    gateway = env_file(root / "etc/cascade/gateway.env")
    assert gateway["CASCADE_API_KEYS_FILE"] == "/etc/cascade/api-keys"
    for path in (keys, root / "etc/cascade/gateway.env", root / "etc/cascade/clef.env"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path
    (key,) = [line for line in keys.read_text().splitlines() if not line.startswith("#")]
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    assert key not in out  # the key is not printed
    admin = root / "etc/cascade/admin-keys"  # the key alone: a Prometheus credentials_file
    assert gateway["CASCADE_ADMIN_KEYS_FILE"] == "/etc/cascade/admin-keys"
    assert stat.S_IMODE(admin.stat().st_mode) == 0o640
    assert re.fullmatch(r"[0-9a-f]{64}\n", admin.read_text()) and key not in admin.read_text()
    # Staging changes nothing on this machine, and says what it would have done there.
    for action in (
        "useradd --system --user-group",
        "chown root:cascade /etc/cascade/api-keys",
        "chown cascade:cascade /var/lib/cascade",
        "systemctl daemon-reload",
    ):
        assert f"would run: {action}" in out, action
    # Another root gets another key; a second run keeps the existing one (and edits).
    other = tmp_path / "other"
    install(other, VENV=str(VENV))
    assert (other / "etc/cascade/api-keys").read_text() != keys.read_text()
    (other / "etc/cascade/gateway.env").write_text("CASCADE_PORT=9000\n")
    again = install(other, VENV=str(VENV)).stdout
    assert "kept /etc/cascade/api-keys" in again and "kept /etc/cascade/gateway.env" in again
    assert (other / "etc/cascade/gateway.env").read_text() == "CASCADE_PORT=9000\n"


def test_staging_without_a_venv_prints_how_it_is_built(tmp_path: Path) -> None:
    out = install(tmp_path, PREFIX="/srv/cascade").stdout
    assert "would run: " in out and "-m venv /srv/cascade/.venv" in out
    assert "--require-hashes" in out and "deploy/lock/serve.txt" in out
    assert not (tmp_path / "srv/cascade/.venv").exists()
    # PREFIX moves the virtualenv and the README, and the installed units follow.
    unit = (tmp_path / "etc/systemd/system/cascade-gateway.service").read_text()
    assert "/opt/cascade" not in unit
    assert "ExecStart=/srv/cascade/.venv/bin/cascade serve" in unit
    assert (tmp_path / "srv/cascade/share/doc/cascade/README.md").exists()
    assert (tmp_path / "srv/cascade/share/doc/cascade/docs/deploy.md").exists()
    assert "/srv/cascade/share/doc/cascade/docs/deploy.md" in unit


def test_systemd_analyze_verify_accepts_the_installed_units(
    installed: tuple[Path, str], tmp_path: Path
) -> None:
    root, _ = installed
    assert verify(tmp_path, units=root / "etc/systemd/system") == ""


def test_one_models_directory_everywhere() -> None:
    """Laya and Clef-flash weights live under one directory in every systemd file."""
    for path in (*SYSTEMD.iterdir(), promql.REPO / "policies" / "systemd.toml"):
        for match in re.finditer(r"[\w/.-]*models/[\w/.-]*", path.read_text()):
            assert match.group().startswith(MODELS), (path.name, match.group())


def test_unit_comments_describe_the_install_script() -> None:
    for unit in UNITS:
        text = (SYSTEMD / unit).read_text()
        assert "deploy/systemd/install.sh" in text, unit
        assert "useradd" not in text  # no hand-run steps left for the reader to miss
