"""``cascade export laya``: a Laya checkpoint to the ONNX model the gateway serves (fp32, or
int8 with the flip check that lets it serve)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cascade.cli.numbers import count, share

DEFAULT_MAX_FLIP_RATE = 0.005  # the default of [tiers.laya] max_flip_rate


def register(groups: dict[str, Any]) -> None:
    export = groups["export"].add_parser(
        "laya",
        help="export a Laya checkpoint to ONNX (fp32 self-checked against torch; int8 "
        "checked on your requests)",
        description="Export a Laya checkpoint to the fp32 ONNX model the gateway serves, check "
        "its outputs against torch, and print the output directory. The gateway exports fp32 on "
        "first use by itself; this command does it ahead of time (a build step). "
        "--precision int8 also writes the int8 export; with --check DATA.jsonl (or --from-log) "
        "it runs both precisions on those requests and writes the flip report without which "
        "the gateway refuses to serve int8.",
    )
    export.add_argument(
        "checkpoint",
        help="checkpoint directory, name (english, multilingual, typed-decisions) or alias",
    )
    export.add_argument(
        "--out",
        type=Path,
        help="output directory of this precision's export (default: $CASCADE_CACHE/laya-onnx/"
        "<content hash>[-int8-<recipe>], else ~/.cache/cascade/laya-onnx/...; the gateway "
        "reads the cache)",
    )
    export.add_argument(
        "--precision",
        choices=["fp32", "int8"],
        default="fp32",
        help="fp32 (default) or int8 (per-channel int8 weights on the GEMMs "
        "over every token: the encoder's and the head's)",
    )
    source = export.add_mutually_exclusive_group()
    source.add_argument(
        "--check",
        type=Path,
        metavar="DATA.jsonl",
        help="int8: run both precisions on these requests (the `cascade eval` "
        "data format) and write the flip report",
    )
    source.add_argument(
        "--from-log",
        type=Path,
        metavar="FILE",
        help='int8: the same, on a decision log\'s requests (rows stored with state = "text")',
    )
    export.add_argument(
        "--report",
        type=Path,
        metavar="PATH",
        help="where the flip report goes (default: flip-report.json in the int8 "
        "export, where the gateway looks for it)",
    )
    export.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="the policy whose confidence gate the flips are counted through "
        "(default: policies/default.toml)",
    )
    export.add_argument(
        "--max-flip-rate",
        type=share,
        metavar="RATE",
        default=DEFAULT_MAX_FLIP_RATE,
        help="largest share of changed answers that passes (default 0.005)",
    )
    export.add_argument(
        "--clients",
        type=count,
        default=8,
        help="concurrent requests while timing each precision (default 8)",
    )
    export.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from cascade.laya.hub import resolve_checkpoint

    ckpt = resolve_checkpoint(args.checkpoint)
    if args.precision == "fp32":
        if args.check or args.from_log or args.report:
            raise SystemExit("--check, --from-log and --report go with --precision int8")
        from cascade.laya.export import export

        print(export(ckpt, args.out))
        return 0
    if args.out and (args.check or args.from_log):
        raise SystemExit(
            "--check runs the exports in the cache, where the gateway finds them; leave out --out"
        )
    from cascade.laya.int8 import export_int8

    target = export_int8(ckpt, args.out)
    if args.check or args.from_log:
        return _check(args, ckpt, target)
    print(
        f"laya int8: no flip check run; the gateway serves this export only with a passing "
        f"report: `cascade export laya {args.checkpoint} --precision int8 --check DATA.jsonl`"
    )
    print(target)
    return 0


def _check(args: argparse.Namespace, ckpt: Path, target: Path) -> int:
    from cascade.build import DEFAULT_POLICY
    from cascade.eval.flips import flip_report, items_from_data, items_from_log, summary_lines
    from cascade.laya.flip_report import write_report
    from cascade.laya.int8 import REPORT_FILE
    from cascade.policy.files import load_policy

    policy = load_policy(args.policy or DEFAULT_POLICY)
    source = args.check or args.from_log
    items, left_out = (items_from_data if args.check else items_from_log)(source)
    if left_out:
        what = "items with images" if args.check else "log rows without their state text"
        print(f"laya int8: {left_out} {what} left out")
    report = flip_report(
        ckpt,
        target,
        items,
        policy,
        policy_file=str(args.policy or "default"),
        data=str(source),
        max_flip_rate=args.max_flip_rate,
        cache=None,
        clients=args.clients,
    )
    path = args.report or target / REPORT_FILE
    write_report(path, report)
    print("\n".join(summary_lines(report)))
    print(f"laya int8: flip report written to {path}")
    print(target)
    return 0 if report.passed else 1
