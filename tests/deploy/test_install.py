"""The Quickstart installs with a stock pip: the Makefile's own pip commands, resolved with no
pip configuration (``PIP_CONFIG_FILE=/dev/null``, no ``PIP_*`` variables) by
``pip install --dry-run --report``, so a pin only our machines' pip configuration can satisfy
fails here.

The Makefile installs a lock in two pip calls: the pins with a local version (``+cpu``: PyPI
refuses local versions) from PyTorch's CPU index, then the whole lock from PyPI alone (the
first call's pins are then installed, so pip looks nothing up for them). The recipe runs for
real under ``make`` with a ``pip`` that records its arguments; the PyPI call is then resolved
against PyPI with those arguments, and the PyTorch-index call is checked against the wheels
that index publishes (the CI machines cannot reach download.pytorch.org).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy import promql

REPO = promql.REPO
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
# What PyTorch's CPU index publishes (https://download.pytorch.org/whl/cpu/torch/, the
# sha256 fragment of torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl). A lock pinning a
# wheel built or downloaded elsewhere fails below; bumping torch means adding its hash here,
# read from that page.
PUBLISHED = {
    "torch==2.13.0+cpu": {
        "6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b",
    },
}
# ``name==version \`` or, with an environment marker, ``name==version ; marker \``.
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)(?: ;[^\\\n]*)? \\$", re.MULTILINE)
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def stock_environment() -> dict[str, str]:
    """This process's environment with no pip configuration: no file, no ``PIP_*``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def pins(text: str) -> dict[str, set[str]]:
    """``name==version`` -> its hashes, for each pin of a lock file's text."""
    out: dict[str, set[str]] = {}
    starts = [(m.start(), f"{m[1].lower()}=={m[2]}") for m in PIN.finditer(text)]
    for (start, pin), (end, _) in zip(starts, [*starts[1:], (len(text), "")], strict=True):
        out[pin] = set(HASH.findall(text[start:end]))
    return out


def canonical(name: str, version: str) -> str:
    """``name==version`` with the name normalized as PyPI does (PEP 503)."""
    return f"{re.sub(r'[-_.]+', '-', name).lower()}=={version}"


def make_pip_calls(lock: str, work: Path) -> tuple[list[list[str]], Path]:
    """The pip calls ``make`` makes to install ``lock`` (its recipe run with a recording pip),
    and the virtualenv directory it wrote to."""
    venv, bin_dir, calls = work / "venv", work / "bin", work / "calls.jsonl"
    venv.mkdir()
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)  # the recipe's `test -x $(BIN)/python`
    pip = bin_dir / "pip"
    pip.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    pip.chmod(0o755)
    make = shutil.which("make")
    assert make is not None, "make is not installed (the Quickstart needs it)"
    subprocess.run(
        [make, "-B", f"VENV={venv}", f"BIN={bin_dir}", f"{venv}/.installed-{lock}"],
        cwd=REPO,
        check=True,
        env=stock_environment(),
        capture_output=True,
    )
    return [json.loads(line) for line in calls.read_text().splitlines()], venv


def requirement_file(call: list[str]) -> Path:
    return Path(call[call.index("-r") + 1])


@pytest.mark.parametrize("lock", ["serve", "test"])
def test_the_lock_installs_with_a_stock_pip(lock: str, tmp_path: Path) -> None:
    calls, venv = make_pip_calls(lock, tmp_path)
    lock_path = REPO / "deploy" / "lock" / f"{lock}.txt"
    locked = pins(lock_path.read_text())
    local_calls = [c for c in calls if "--index-url" in c]
    pypi_calls = [c for c in calls if "-r" in c and "--index-url" not in c]
    assert len(local_calls) == 1 and len(pypi_calls) == 1, calls

    # The first call: the pins PyPI cannot have, from PyTorch's index, as it publishes them.
    (local,) = local_calls
    assert local[local.index("--index-url") + 1] == TORCH_INDEX
    assert {"--no-deps", "--require-hashes"} <= set(local)
    local_pins = pins(requirement_file(local).read_text())
    assert local_pins == {pin: h for pin, h in locked.items() if "+" in pin}
    for pin, hashes in local_pins.items():
        assert hashes and hashes <= PUBLISHED.get(pin, set()), (
            f"{pin} in {lock_path.name} is not a wheel {TORCH_INDEX} publishes"
        )

    # The second call, on PyPI alone with a stock configuration: every other pin resolves,
    # with the lock's hashes checked.
    (pypi,) = pypi_calls
    assert Path(pypi[pypi.index("-r") + 1]) == Path(f"deploy/lock/{lock}.txt")
    assert not {"--index-url", "--extra-index-url", "--find-links", "-f", "-i"} & set(pypi)
    rest = tmp_path / "pypi-pins.txt"
    rest.write_text(lock_path.read_text().replace(requirement_file(local).read_text(), ""))
    args = [str(rest) if a == pypi[pypi.index("-r") + 1] else a for a in pypi]
    report = tmp_path / "report.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            *args,
            "--dry-run",
            "--ignore-installed",
            "--report",
            str(report),
        ],
        cwd=REPO,
        env=stock_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    resolved = {
        canonical(item["metadata"]["name"], item["metadata"]["version"])
        for item in json.loads(report.read_text())["install"]
    }
    normalized = {canonical(*pin.split("==")) for pin in locked if "+" not in pin}
    assert resolved == normalized
    assert (venv / f".installed-{lock}").exists()
