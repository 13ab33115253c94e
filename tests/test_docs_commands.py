"""Every command the docs show is run: the ``$ `` lines of each fenced ``console`` block in
README.md and docs/*.md, in a temporary folder holding a copy of ``policies/``, with this
interpreter's ``cascade`` first on PATH. A command exits 0, or the status shown on an output
line ``[exit N]``; each other output line shown under it must appear in what it prints
(blanks collapsed). The commands of one page share its folder, in the page's order. What
cannot run here is skipped by the patterns of ``SKIPS``, each with its reason, and nothing else.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# (pattern searched in the command, why it cannot run in CI). Keep it short: a command that can
# run here is run.
SKIPS: list[tuple[str, str]] = [
    (
        r"^make (serve|test)\b",
        "the Quickstart itself: `make serve` serves until stopped, `make test` is this suite",
    ),
    (
        r"^cascade (serve|engine clef)\b(?!.*--help)",
        "serves until stopped (tests/cli/test_serve_demo.py starts `serve --demo` under control)",
    ),
    (
        r"localhost:8000|127\.0\.0\.1:800\d|host:8000",
        "sends to a gateway already running (the Quickstart's two requests: test_serve_demo.py)",
    ),
    (
        r"/models/|DATA\.jsonl|requests\.jsonl|decisions\.(db|sqlite)",
        "the reader's own weights or data (placeholders); the real weights are 19 GB and a GPU",
    ),
    (r"^cascade bench\b", "benchmarks take minutes; their figures are in docs/benchmarks.md"),
    (r"^docker compose\b|\| kubectl apply\b", "needs a Docker daemon or a Kubernetes cluster"),
    (
        r"^cascade store migrate postgresql://",
        "needs the reader's PostgreSQL (tests/store/ run it against a server of their own)",
    ),
    (r"^ollama\b", "needs Ollama and its 6 GB model download"),
    (r"^\.venv/bin/(ruff|mypy)\b", "`make test` runs them on the repository itself"),
]
TIMEOUT_S = 60  # one command; all of them take about 10 s together, none needs ``slow``


@dataclass
class Command:
    page: str
    line: int
    text: str
    shown: list[str] = field(default_factory=list)  # output lines shown under it
    status: int = 0

    def skip_reason(self) -> str | None:
        return next((why for pattern, why in SKIPS if re.search(pattern, self.text)), None)


def _complete(text: str) -> bool:
    if text.rstrip().endswith(("\\", "|")):
        return False
    try:
        shlex.split(text, comments=True)
    except ValueError:  # an open quote: the command goes on
        return False
    return True


def console_commands(page: Path) -> list[Command]:
    """The commands of ``page``'s ``console`` blocks, with the output shown under each."""
    commands: list[Command] = []
    block = False
    pending: Command | None = None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            block = line.strip() == "```console"
            pending = None
            continue
        if not block:
            continue
        if pending is not None:
            pending.text += "\n" + line
            if _complete(pending.text):
                pending = None
        elif line.startswith("$ "):
            command = Command(page.name, number, line[2:])
            commands.append(command)
            if not _complete(command.text):
                pending = command
        elif line.strip().startswith("#") or not line.strip() or not commands:
            continue  # a comment that goes on from the command above
        elif status := re.fullmatch(r"\[exit (\d+)\]", line.strip()):
            commands[-1].status = int(status.group(1))
        else:
            commands[-1].shown.append(line)
    return commands


ALL = [c for page in PAGES for c in console_commands(page)]


def _squash(text: str) -> str:
    return " ".join(text.split())


def _environment(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    return env


def run(command: Command, cwd: Path) -> None:
    done = subprocess.run(
        ["bash", "-c", command.text],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=_environment(Path(sys.executable).parent),
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    printed = done.stdout + done.stderr
    where = f"{command.page}:{command.line}: {command.text}"
    assert done.returncode == command.status, f"{where}\nexit {done.returncode}\n{printed}"
    for line in command.shown:
        assert _squash(line) in _squash(printed), f"{where}\nnot printed: {line}\n{printed}"


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if any(c.page == p.name and c.skip_reason() is None for c in ALL)],
    ids=lambda p: p.name,
)
def test_the_commands_of_a_page_run(page: Path, tmp_path: Path) -> None:
    shutil.copytree(REPO / "policies", tmp_path / "policies")
    for command in ALL:
        if command.page == page.name and command.skip_reason() is None:
            run(command, tmp_path)


def test_the_docs_show_commands_and_every_skip_is_used() -> None:
    """The runner finds the commands (a changed fence cannot silently empty it), and each skip
    pattern still matches a command (a stale skip is removed, not kept)."""
    ran = [c for c in ALL if c.skip_reason() is None]
    assert len(ran) >= 8, [c.text for c in ran]
    for pattern, why in SKIPS:
        assert any(re.search(pattern, c.text) for c in ALL), (pattern, why)
    assert {c.page for c in ALL} >= {
        "README.md",
        "configuration.md",
        "tenants.md",
        "policies.md",
        "development.md",
    }


def test_the_links_outside_the_site_resolve() -> None:
    """README.md and CHANGELOG.md are not built by mkdocs: their relative links are checked
    here, a page's anchor against the page's headings as mkdocs makes them."""
    for name in ("README.md", "CHANGELOG.md"):
        text = (REPO / name).read_text()
        for target in re.findall(r"\]\((?!https?:)([^)#]+)(?:#([^)]+))?\)", text):
            path, anchor = REPO / target[0], target[1]
            assert path.is_file(), (name, target)
            if anchor:
                headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
                slugs = {
                    re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings
                }
                assert anchor in slugs, (name, target)


def test_the_parser_reads_continuations_output_and_status(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```console\n$ echo 'a\nb' |\n  cat   # two lines\n  # more comment\na\n"
        "$ false \\\n  || exit 3\n[exit 3]\n```\n```\n$ not console\n```\n"
    )
    first, second = console_commands(page)
    assert first.text == "echo 'a\nb' |\n  cat   # two lines" and first.shown == ["a"]
    assert second.text == "false \\\n  || exit 3" and second.status == 3
    run(first, tmp_path)
    run(second, tmp_path)
