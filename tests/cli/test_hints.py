"""Hints that work: each names a command a newcomer can run as written (the real distribution
name, the hub's own CLI, the way out of offline mode, make's own variables, kubectl alone)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from tests.cli.test_errors import cascade, refused
from tests.servers import require_tool

ROOT = Path(__file__).parents[2]
# Where hints live: the package's messages, the deploy files, the Makefile, the README and docs/.
HINTED = [
    *sorted((ROOT / "cascade").rglob("*.py")),
    *sorted(
        p
        for p in (ROOT / "deploy").rglob("*")
        if p.is_file() and "lock" not in p.parts and p.suffix not in (".json", ".png")
    ),
    ROOT / "Makefile",
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
# The PyPI project `cascade` (not ours), the hub CLI before `hf`, a binary nothing installs.
STALE = (r"(?<![\w.-])cascade\[(?:export|gpu|eval|test)", r"huggingface-cli", r"kustomize edit")


def test_no_hint_names_the_wrong_distribution_or_the_old_hub_cli() -> None:
    """`cascade` on PyPI is another project; huggingface_hub 2 ships `hf`."""
    stale = []
    for path in HINTED:
        text = path.read_text(errors="replace")
        for pattern in STALE:
            stale += [f"{path.relative_to(ROOT)}: {m[0]}" for m in re.finditer(pattern, text)]
    assert stale == []


def test_the_offline_hint_says_to_unset_hf_hub_offline(tmp_path: Path) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    out = refused(
        cascade("serve", "--laya", "multilingual", "--port", "0", env=env),
        1,
        "unset HF_HUB_OFFLINE",
        "hf download convaiinnovations/laya",
    )
    assert "cascade export laya" not in out  # it would fail the same way while offline


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``make`` in the checkout with the installed venv taken as done and this interpreter's
    ``bin`` as the venv's (``cascade`` there imports this checkout)."""
    tool = shutil.which("make")
    assert tool is not None, "make is not installed (the Quickstart needs it)"
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CASCADE_") and k not in ("PORT", "HOST")
    }
    environ |= {"PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [tool, "-o", ".venv/.installed-serve", *args, f"BIN={Path(sys.executable).parent}"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_make_serve_takes_port_and_host_from_make_or_the_environment() -> None:
    assert "--host 0.0.0.0 --port 9123" in make("-n", "serve", "PORT=9123", "HOST=0.0.0.0").stdout
    env = {"CASCADE_PORT": "9124", "CASCADE_HOST": "127.0.0.2"}
    assert "--host 127.0.0.2 --port 9124" in make("-n", "serve", env=env).stdout
    assert "--host 127.0.0.1 --port 8000" in make("-n", "serve").stdout


def test_a_taken_port_under_make_says_how_to_pick_another(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        run = make("serve", f"PORT={port}", env={"CASCADE_DEMO_DIR": str(tmp_path / "demo")})
    assert run.returncode != 0
    assert f"port {port} is already in use" in run.stderr, run.stderr
    assert "make serve PORT=N" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "demo").exists()


def test_the_cpu_demo_image_step_needs_only_kubectl(tmp_path: Path) -> None:
    """The overlay header's image command, run on a copy, changes the image kubectl renders."""
    shutil.copytree(ROOT / "deploy" / "k8s", tmp_path / "deploy" / "k8s")
    overlay = tmp_path / "deploy" / "k8s" / "overlays" / "cpu-demo"
    header = (overlay / "kustomization.yaml").read_text()
    step = re.search(
        r"^#   (sed -i .*?kustomization\.yaml)$", header.replace("\\\n#      ", ""), re.MULTILINE
    )
    assert step, header
    subprocess.run(step[1], shell=True, cwd=tmp_path, check=True)
    out = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    images = {
        c["image"]
        for doc in yaml.safe_load_all(out)
        if doc and doc["kind"] == "Deployment"
        for c in doc["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"registry.local:5000/cascade-demo:0.1.0"}
