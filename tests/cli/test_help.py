"""``--help`` describes every command and flag (and its CASCADE_* variable), ``--version``, and
the shell completion scripts."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from collections.abc import Iterator

import msgspec
import pytest

from cascade import __version__
from cascade.cli import build_parser, main
from cascade.settings import Settings

FIELDS = {f.name for f in msgspec.structs.fields(Settings)}
# The commands that build their settings from CASCADE_* variables and their flags on top.
FROM_ENVIRONMENT = {"cascade serve", "cascade engine clef"}
OTHER_VARIABLES = {"CASCADE_CACHE"}  # read where it is used (the export and distill caches)


def commands(
    parser: argparse.ArgumentParser, name: str = "cascade"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from commands(sub, f"{name} {sub_name}")


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    skip = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    return [a for a in parser._actions if not isinstance(a, skip)]


def test_every_command_and_flag_is_described() -> None:
    found = list(commands(build_parser()))
    assert len(found) > 20
    for name, parser in found:
        assert parser.description, f"{name} has no description"
        for action in options(parser):
            assert action.help, f"{name} {'/'.join(action.option_strings) or action.dest}"


def test_flags_name_their_environment_variable_and_only_real_ones() -> None:
    for name, parser in commands(build_parser()):
        for action in options(parser):
            flag = f"{name} {'/'.join(action.option_strings)}"
            if action.dest in FIELDS and (name in FROM_ENVIRONMENT or "clef_" in action.dest):
                assert f"CASCADE_{action.dest.upper()}" in action.help, flag
            for variable in re.findall(r"CASCADE_[A-Z_]+", action.help or ""):
                assert variable in OTHER_VARIABLES or variable[8:].lower() in FIELDS, (
                    flag,
                    variable,
                )


def test_calibrate_describes_its_own_policy_flag() -> None:
    calibrate = dict(commands(build_parser()))["cascade calibrate"]
    policy = next(a for a in calibrate._actions if a.dest == "policy")
    assert "evaluate" not in policy.help and "cheap tier" in policy.help


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"cascade {__version__}"


@pytest.mark.parametrize("shell", ["bash", "zsh", "tcsh"])
def test_completion_scripts_know_every_command(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    words = ["serve", "calibrate", "distill", "completion", "clef", "check"]
    if shell != "tcsh":  # shtab's tcsh script completes commands, not flags
        words += ["--policy", "--log-level"]
    for word in words:
        assert word in script, (shell, word)
    interpreter = shutil.which(shell)
    if shell == "bash" and interpreter:  # the script is valid bash
        checked = subprocess.run([interpreter, "-n"], input=script, text=True, capture_output=True)
        assert checked.returncode == 0, checked.stderr
