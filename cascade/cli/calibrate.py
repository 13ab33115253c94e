"""``cascade calibrate``: fit per (type x band) thresholds and temperatures into a TOML file.

The cheap tier runs on the data (cached with ``--cache DIR``; the strong tier is not needed),
or the rows of a decision log are read (``--from-log FILE --teacher strong``). The fit is
``cascade.eval.fit``'s; the file (``cascade.policy.calibration``) is stamped with both tiers'
content hashes and the data's size, and is used by ``[calibration] file = "..."`` in a policy or
``--calibration FILE`` on ``serve``, ``eval`` and ``route``. From data (not a log, which keeps no
vectors) it also fits the novelty gate's reference set, ``OUT.novelty.npz``
(``cascade.novelty.reference``), named with its SHA-256 in the file's ``[novelty]``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from cascade.answers import demo_label
from cascade.cli.errors import UsageError
from cascade.cli.eval import check_source, data_flags, random_of, tier_flags, tier_policy
from cascade.cli.numbers import count, share
from cascade.cli.summary import rounded

if TYPE_CHECKING:
    from cascade.eval.decide import ItemRow
    from cascade.policy.model import Policy, Reference


def register(groups: dict[str, Any]) -> None:
    cal = groups["<top>"].add_parser(
        "calibrate",
        help="fit thresholds and temperatures per question type and option band",
        description="Fit per (question type x option band) temperatures (NLL) and confidence "
        "thresholds for one target, and write them as a calibration file stamped with the "
        "tiers' weights.",
    )
    data_flags(cal)
    cal.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="FILE",
        help="the calibration file to write (TOML)",
    )
    tier_flags(
        cal,
        url=False,
        policy_help="the policy file whose cheap tier is calibrated (only that tier runs)",
    )
    target = cal.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--target-escalation",
        type=share,
        metavar="R",
        help="escalate a share R of the questions the cheap tier answers",
    )
    target.add_argument(
        "--target-accuracy",
        type=share,
        metavar="A",
        help="the lowest escalation whose kept answers reach accuracy A "
        "(one-sided 95 %% Clopper-Pearson lower bound)",
    )
    cal.add_argument(
        "--min-cell",
        type=count,
        default=30,
        metavar="N",
        help="a (type x band) with fewer questions gets the pooled fit (default 30)",
    )
    cal.add_argument(
        "--cache",
        type=Path,
        metavar="DIR",
        help="cache the cheap tier's outputs here (e.g. an eval --out DIR)",
    )
    cal.add_argument(
        "--json",
        action="store_true",
        help="print the summary as one JSON object instead of a table",
    )
    cal.set_defaults(func=calibrate_command)


def calibrate_command(args: argparse.Namespace) -> int:
    from cascade.build import fingerprints
    from cascade.cli.usage import filters
    from cascade.eval.data import DataError, load_items
    from cascade.eval.decide import reaches_gate
    from cascade.eval.evaluate import run_tiers
    from cascade.eval.fit import Target, fit, snapshot
    from cascade.eval.from_log import log_rows
    from cascade.policy.calibration import (
        CalibrationFile,
        CalibrationStamp,
        bands_of,
        write_calibration,
    )
    from cascade.policy.model import Calibration, Thresholds

    check_source(args)
    if args.calibration is not None:
        raise UsageError("calibrate fits a new calibration; drop --calibration")
    target: Target = "escalation" if args.target_escalation is not None else "accuracy"
    value = args.target_escalation if target == "escalation" else args.target_accuracy
    policy, settings = tier_policy(args)
    # Fit on the raw gate: no earlier calibration, no confidence or margin threshold.
    thresholds = msgspec.structs.replace(
        policy.thresholds, confidence=Thresholds().confidence, margin=Thresholds().margin
    )
    gateless = msgspec.structs.replace(policy, thresholds=thresholds, calibration=Calibration())
    if args.from_log:
        rows = log_rows(args.from_log, gateless, labelled_only=False, **filters(args))
        n_items = len({r.id for r in rows})
    else:
        model = policy.models.cascade[0] if policy.models.cascade else "jev-latest"
        try:
            items = load_items(args.data, model=model, limit=args.limit)
        except DataError as exc:  # a bad line: its FILE:LINE, no traceback
            raise SystemExit(f"cascade calibrate: {exc}") from None
        # The strong tier does not run: answered canned, so the questions that reach the gate
        # are those of the cascade serving (a strong-only question never refuses its request).
        rows, _ = asyncio.run(
            run_tiers(
                items,
                gateless,
                settings,
                args.cache,
                slots=["cheap"],
                progress=not args.no_progress,
                canned_strong=True,
            )
        )
        n_items = len(items)
    found, temperatures, diagnostics = fit(rows, target, value, min_cell=args.min_cell)
    gated = sum(reaches_gate(r) for r in rows)
    if not gated:
        raise SystemExit(
            "calibrate: no question reached the cheap tier's confidence gate; nothing to fit"
        )
    source = ", ".join(map(str, args.from_log)) if args.from_log else str(args.data)
    cal = CalibrationFile(
        stamp=CalibrationStamp(
            checkpoints=fingerprints(policy),
            items=n_items,
            questions=gated,
            target=target,
            value=value,
            teacher="strong" if args.from_log else "gold",
            min_cell=args.min_cell,
            data=source,
        ),
        thresholds=bands_of(found),
        temperatures=bands_of(temperatures),
        fit=diagnostics,
        snapshot=snapshot(rows, temperatures, policy.drift.bins),
    )
    header = (
        f"cascade calibration: target {target} {value}, fitted on {gated} gated questions "
        f'of {n_items} items ({source}).\nUse it with `[calibration] file = "..."` in a '
        "policy, or --calibration FILE on serve, eval and route."
    )
    random = random_of(args, policy)
    if args.demo or random:
        header += "\nDEMO: fitted on tiny random weights; it means nothing."
    reference = None if args.from_log else reference_set(policy, rows, Path(args.out))
    if reference is not None:
        cal = msgspec.structs.replace(cal, novelty=reference[0])
    write_calibration(args.out, cal, header)
    escalated = sum(round(f.escalation * f.n) for f in diagnostics.values())
    summary = {
        "out": str(args.out),
        "target": target,
        "value": value,
        "gated_questions": gated,
        "escalation": escalated / gated,
        "cells": diagnostics,
        **demo_label(random),
        "novelty": reference[1] if reference else None,
    }
    print(
        msgspec.json.encode(rounded(msgspec.to_builtins(summary))).decode()
        if args.json
        else table(summary)
    )
    return 0


def reference_set(
    policy: Policy, rows: Sequence[ItemRow], out: Path
) -> tuple[Reference, dict[str, Any]] | None:
    """Fit and write the novelty gate's reference set next to ``out`` (``OUT.novelty.npz``)
    from the pooled vectors of the questions that reached the gate; its ``Reference`` and a
    summary, or None when the cheap tier returned no vectors (an upstream, an old export)."""
    from cascade.build import fingerprints
    from cascade.eval.decide import reaches_gate
    from cascade.novelty.reference import cell_of, fit, save
    from cascade.policy.model import Reference

    vectors: dict[str, list[bytes]] = {}
    for row in rows:
        if reaches_gate(row) and row.cheap is not None and row.cheap.vector is not None:
            vectors.setdefault(cell_of(row.checkpoint, row.type, row.band), []).append(
                row.cheap.vector
            )
    if not vectors or policy.route.cheap is None:
        return None
    novelty = policy.novelty
    ref = fit(
        vectors,
        weights=fingerprints(policy)[policy.route.cheap],
        k=novelty.k,
        dims=novelty.dims,
        max_reference=novelty.max_reference,
        max_flag_rate=novelty.max_flag_rate,
        min_rows=novelty.min_rows,
    )
    path = out.with_name(out.stem + ".novelty.npz")
    digest = save(path, ref)
    return Reference(file=path.name, sha256=digest), {
        "file": str(path),
        "cells": {c: len(v) for c, v in ref.cells.items()},
        "bytes": ref.nbytes,
        "max_flag_rate": ref.max_flag_rate,
        "left_out": sorted(set(vectors) - set(ref.cells)),
    }


def table(summary: dict[str, Any]) -> str:
    """The fit per (type x band) cell, rounded: what a person reads (``--json`` for tools)."""

    def num(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    lines = [
        f"wrote {summary['out']}: target {summary['target']} {summary['value']:g}: "
        f"{summary['escalation']:.1%} of {summary['gated_questions']} gated questions "
        "escalate",
        f"{'cell':<16}{'n':>5}{'threshold':>11}{'temp':>7}{'escalate':>10}"
        f"{'kept acc':>10}{'95% low':>9}",
    ]
    for name, cell in summary["cells"].items():
        lines.append(
            f"{name + (' *' if cell.pooled else ''):<16}{cell.n:>5}"
            f"{num(cell.threshold, '.3f'):>11}{cell.temperature:>7.2f}"
            f"{cell.escalation:>10.1%}{num(cell.accepted_accuracy, '.1%'):>10}"
            f"{num(cell.lower_bound, '.1%'):>9}"
        )
    if any(cell.pooled for cell in summary["cells"].values()):
        lines.append("* too few questions in the cell: the pooled fit applies")
    novelty = summary.get("novelty")
    if novelty is None:
        lines.append("novelty gate: no reference set (no pooled vectors: the gate stays off)")
    else:
        lines.append(
            f"novelty reference set {novelty['file']}: "
            + ", ".join(f"{c} {n}" for c, n in novelty["cells"].items())
            + f" vectors ({novelty['bytes']} bytes), flagging "
            f"{novelty['max_flag_rate']:.1%} of them"
            + (
                f"; too few for {', '.join(novelty['left_out'])} (gate off there)"
                if novelty["left_out"]
                else ""
            )
        )
    return "\n".join(lines)
