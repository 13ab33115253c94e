"""``tests/system-tools.sh`` (run by ``make test``) names every system tool the tests start:
on a machine without them, as a user who cannot install, it names their Debian packages."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.deploy import promql

SCRIPT = promql.REPO / "tests" / "system-tools.sh"
PRESENT = ("prometheus", "promtool", "systemd-analyze", "chromium", "redis-server")


def test_missing_node_and_npm_are_named_as_debian_packages(tmp_path: Path) -> None:
    for tool in PRESENT:
        (tmp_path / tool).write_text("#!/bin/sh\n")
        (tmp_path / tool).chmod(0o755)
    (tmp_path / "id").write_text("#!/bin/sh\necho 1000\n")  # not root: report, do not install
    (tmp_path / "id").chmod(0o755)
    sort = shutil.which("sort")
    assert sort is not None
    os.symlink(sort, tmp_path / "sort")
    bash = shutil.which("bash")
    assert bash is not None
    run = subprocess.run(
        [bash, str(SCRIPT)], env={"PATH": str(tmp_path)}, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 1
    assert "which are not installed: nodejs npm." in run.stderr, run.stderr
    assert "sudo apt-get install nodejs npm" in run.stderr
