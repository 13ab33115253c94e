"""``cascade distill SOURCE (--policy P [--laya DIR] | --demo) --out NEWDIR``.

Fine-tunes the cheap tier's Laya checkpoint toward the strong tier's answers
(``cascade.learn``), prints the held-back figures before and after, and writes NEWDIR only when
agreement with the teacher improved (exit 1 otherwise; 2 when the run cannot start).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import msgspec

from cascade.answers import demo_banner, demo_label
from cascade.cli.numbers import count, natural, positive
from cascade.cli.serve import clef_flags
from cascade.cli.usage import filter_flags, filters
from cascade.errors import install_hint
from cascade.store import log_source, missing

REFUSED = 1
CANNOT_START = 2


def register(groups: dict[str, Any]) -> None:
    parser = groups["<top>"].add_parser(
        "distill",
        help="fine-tune the cheap tier's Laya checkpoint on the strong tier's answers",
        description=(
            "Distil the strong tier into a new Laya checkpoint. The teacher is the policy's "
            "strong tier (run here, batched, cached in the run directory) or the strong answers "
            "of a decision log; the student is the policy's default Laya checkpoint (or --laya). "
            "A held-back split is never trained on; NEWDIR is written only when its agreement "
            "with the teacher improved."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "source",
        nargs="?",
        type=Path,
        metavar="SOURCE",
        help="request file, one JSON object per line: id, state, questions "
        "(gold and anything else ignored)",
    )
    source.add_argument(
        "--from-log",
        type=log_source,
        action="append",
        metavar="FILE|URL",
        help="a decision log with state text: learn from the rows the strong "
        "tier answered, shadow samples and escalations weighted back to traffic "
        "(repeat for rotated files), or a fleet's postgresql:// URL",
    )
    filter_flags(parser)
    tiers = parser.add_mutually_exclusive_group(required=True)
    tiers.add_argument(
        "--policy",
        metavar="P",
        help="policy file: its strong tier teaches, its default Laya checkpoint learns",
    )
    tiers.add_argument(
        "--demo",
        action="store_true",
        help="the demo's tiny random checkpoints (demo Clef teaches demo Laya)",
    )
    parser.add_argument(
        "--laya",
        metavar="DIR",
        help="the checkpoint to fine-tune instead of the policy's default (directory or hub id)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="NEWDIR",
        help="the new checkpoint directory (must not exist)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="teacher cache and "
        "training state (default: $CASCADE_CACHE/distill/<key>; re-running "
        "resumes)",
    )
    parser.add_argument(
        "--held-back",
        type=float,
        default=0.2,
        metavar="F",
        help="share of items never trained on, for the figures (default 0.2)",
    )
    parser.add_argument(
        "--epochs", type=natural, default=12, help="passes over the training rows (default 12)"
    )
    parser.add_argument("--lr", type=positive, default=2e-3, help="peak learning rate (2e-3)")
    parser.add_argument("--batch-size", type=count, default=16, help="rows per step (16)")
    parser.add_argument(
        "--train",
        choices=["all", "head"],
        default="all",
        help="tensors to train: all (default) or head (everything after the encoder)",
    )
    parser.add_argument("--seed", type=int, default=0, help="shuffling seed (0)")
    parser.add_argument(
        "--device",
        default="auto",
        help="where to train: auto (CUDA when present, default), cpu, cuda",
    )
    parser.add_argument(
        "--threads",
        type=count,
        metavar="N",
        help="torch CPU threads for training "
        "(default: one per 256 hidden units of the student, at most the cores "
        "available)",
    )
    clef_flags(parser)
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars (they are drawn only when stderr is a terminal)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the held-back figures as one JSON object instead of a table",
    )
    parser.set_defaults(func=run_distill)


def run_distill(args: argparse.Namespace) -> int:
    for path in [*([args.source] if args.source else []), *missing(args.from_log or [])]:
        if not Path(path).is_file():  # before torch is imported
            print(f"cascade distill: {path}: no such file", file=sys.stderr)
            return CANNOT_START
    try:
        from cascade.learn import distill
        from cascade.learn.train import TrainConfig
    except ImportError as exc:
        print(
            f"cascade distill needs torch, transformers and tqdm ({exc.name} is missing): "
            f"{install_hint('export', 'eval')}",
            file=sys.stderr,
        )
        return CANNOT_START
    from cascade.settings import from_env

    if not 0 < args.held_back < 1:
        print("cascade distill: --held-back must be between 0 and 1", file=sys.stderr)
        return CANNOT_START
    options = distill.DistillOptions(
        source=args.source,
        from_log=args.from_log or [],
        log_filters=filters(args),
        settings=from_env(
            policy=args.policy,
            demo=args.demo or None,
            clef_overlong=args.clef_overlong,
            clef_max_length=args.clef_max_length,
        ),
        laya=args.laya,
        out=args.out,
        run_dir=args.run_dir,
        held_back=args.held_back,
        device=args.device,
        threads=args.threads,
        progress=not args.no_progress and sys.stderr.isatty(),
        config=TrainConfig(
            epochs=args.epochs,
            lr=args.lr,
            batch_size=args.batch_size,
            train=args.train,
            seed=args.seed,
        ),
    )
    from cascade.errors import CascadeError

    try:
        report = distill.run(options)
    except (distill.DistillError, FileExistsError, ValueError, OSError) as exc:
        print(f"cascade distill: {exc}", file=sys.stderr)
        return CANNOT_START
    except CascadeError as exc:  # the teacher failed; its finished answers are cached
        print(
            f"cascade distill: the strong tier failed: {exc.message}; run the same command "
            "again to resume",
            file=sys.stderr,
        )
        return CANNOT_START
    demo_banner("distill", report.meta.get("random_tiers", []))
    print(as_json(report) if args.json else table(report))
    if not report.written:
        print(
            f"cascade distill: refused: held-back agreement with the teacher did not improve "
            f"({report.before.agreement:.1%} -> {report.after.agreement:.1%}); {args.out} "
            f"not written (figures in {report.run_dir / 'distill.json'})",
            file=sys.stderr,
        )
        return REFUSED
    print(f"wrote {args.out}")
    return 0


def as_json(report: Any) -> str:
    """The figures ``table`` prints, rounded, as one JSON object (all of them are in
    ``distill.json``)."""
    from cascade.cli.summary import rounded

    figures = {
        name: rounded(msgspec.to_builtins(getattr(report, name))) for name in ("before", "after")
    }
    return msgspec.json.encode(
        {
            "out": str(report.out),
            "written": report.written,
            "data": report.meta["data"],
            **figures,
            **demo_label(report.meta.get("random_tiers", [])),
        }
    ).decode()


def table(report: Any) -> str:
    data, before, after = report.meta["data"], report.before, report.after
    lines = [
        f"data: {data['items']} items (left out: {data['left_out'] or 'none'}); "
        f"{data['train_rows']} training and {data['held_back_rows']} held-back questions "
        f"(skipped: {data['skipped'] or 'none'})",
        f"{'held back':<16}{'before':>10}{'after':>10}",
        f"{'agreement':<16}{before.agreement:>10.1%}{after.agreement:>10.1%}",
        f"{'mean KL (nats)':<16}{before.mean_kl:>10.4f}{after.mean_kl:>10.4f}",
        f"{'kept on cheap':<16}{before.kept_on_cheap:>10.1%}{after.kept_on_cheap:>10.1%}",
    ]
    return "\n".join(lines)
