"""``cascade policy check FILE...``: every finding as ``FILE:LINE: severity: message``; exit 1
when any is an error."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cascade.policy.files import PolicyError, check_text, format_finding, read_policy_text
from cascade.policy.toml_keys import key_lines, locate


def register(groups: dict[str, Any]) -> None:
    top = groups["<top>"]
    policy = top.add_parser(
        "policy",
        help="policy files: check them",
        description="Work with policy files (policies/*.toml).",
    )
    sub = policy.add_subparsers(dest="target", metavar="TARGET", required=True)
    check = sub.add_parser(
        "check",
        help="report unknown keys, undefined tiers and impossible "
        "thresholds as FILE:LINE: messages; exit 1 on errors",
        description="Check policy files without loading any model: every "
        "finding is printed as FILE:LINE: error|warning: message (the lines "
        "`cascade serve --policy` prints when it refuses a file); exit 1 "
        "when any is an error.",
    )
    check.add_argument("files", nargs="+", type=Path, metavar="FILE", help="policy TOML files")
    check.set_defaults(func=check_command)


def check_command(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        try:
            text = read_policy_text(path)
        except PolicyError as exc:
            print(*exc.messages, sep="\n")
            failed = True
            continue
        _, found = check_text(text)
        lines = key_lines(text)
        for finding in sorted(found, key=lambda f: locate(lines, f.path)):
            print(format_finding(str(path), text, finding))
        errors = sum(f.severity == "error" for f in found)
        failed |= errors > 0
        if not found:
            print(f"{path}: ok")
    return 1 if failed else 0
