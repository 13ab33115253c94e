"""``cascade route FILE.jsonl --policy P``: a capacity-planning dry run of pre-routing.

It routes each request of a JSONL file (``{"id", "source", "state", "questions", ...}`` per
line) through the gateway's flow on exact token counts from the cheap tier's tokenizers, runs no
model (each tier answers with a canned, certain answer), and prints how requests and questions
split between the tiers and why. Confidence escalations need inference, so they are not in its
figures. Imports neither torch nor onnxruntime at module level.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from cascade.calls import EngineCall, Image
from cascade.engines.base import Previewing
from cascade.errors import ClientError
from cascade.policy.calibration import (
    CalibrationError,
    check_checkpoints,
    with_calibration_file,
)
from cascade.policy.canned import certain
from cascade.policy.files import PolicyError, load_policy
from cascade.policy.flow import Ask, Decision, Reply, TierCall, decide, run
from cascade.policy.model import Checkpoint, Checkpoints, LayaTier, Policy
from cascade.request.decode import text_call

SUBDIRS: dict[Checkpoint, str] = {
    "multilingual": "multilingual",
    "typed-decisions": "typed-decisions",
}


def register(groups: dict[str, Any]) -> None:
    top = groups["<top>"]
    route = top.add_parser(
        "route",
        help="dry-run pre-routing of a JSONL request file: how it "
        "would split between tiers, and why (no inference)",
        description="Pre-route every request of FILE.jsonl with the policy, "
        "on exact token counts from the cheap tier's tokenizers, and print "
        "how requests and questions split between the tiers and why. Runs no "
        "model and downloads nothing; confidence escalations need inference "
        "and are not counted.",
    )
    route.add_argument(
        "requests",
        type=Path,
        metavar="FILE.jsonl",
        help='one request per line: {"state", "questions", "images"?, "source"?}',
    )
    route.add_argument(
        "--policy", type=Path, required=True, metavar="P", help="the policy file to route with"
    )
    route.add_argument(
        "--laya",
        type=Path,
        metavar="DIR",
        help="a Laya checkpoint bundle (DIR = english, DIR/multilingual, "
        "DIR/typed-decisions) instead of the policy's checkpoints",
    )
    route.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="apply a calibration file, checked against the cheap tier's "
        "weights (its thresholds act after inference: the dry run's split "
        "does not change)",
    )
    route.add_argument("--json", action="store_true", help="print JSON instead of tables")
    route.set_defaults(func=route_command)


class Split(msgspec.Struct):
    """Counts of one dry run (the JSON ``--json`` prints)."""

    requests: int = 0
    questions: int = 0
    requests_by_route: Counter[str] = msgspec.field(default_factory=Counter)
    questions_by_tier: Counter[str] = msgspec.field(default_factory=Counter)
    reasons: Counter[str] = msgspec.field(default_factory=Counter)
    checkpoints: Counter[str] = msgspec.field(default_factory=Counter)
    refused: Counter[str] = msgspec.field(default_factory=Counter)
    sources: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)


def route_command(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        policy, checkpoints = laya_checkpoints(policy, args.laya)
    except ValueError as exc:  # CheckpointError: not a checkpoint, or not in the local cache
        print(f"{args.policy}: error: {exc}; pass --laya DIR", file=sys.stderr)
        return 1
    if args.calibration is not None:
        try:
            policy = _calibrated(policy, args.calibration)
        except CalibrationError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    from cascade.laya.preview import Previewer

    tier = policy.cheap_tier()
    previewer = None
    if checkpoints and isinstance(tier, LayaTier):
        previewer = Previewer(checkpoints, default=tier.default_checkpoint)
    split = Split()
    for lineno, line in _lines(args.requests):
        source = _source_of(line)
        try:
            call = _call(line, lineno)
            decision = run(decide(policy, call, previews=previewer is not None), _dry(previewer))
        except ClientError as exc:
            split.refused[getattr(exc, "error_type", "invalid_request_error")] += 1
            _source(split, source)["refused"] += 1
            print(f"{args.requests}:{lineno}: refused: {exc}", file=sys.stderr)
            continue
        _count(split, policy, source, decision)
    from cascade.answers import demo_banner, demo_label
    from cascade.build import random_weights

    random = [policy.route.cheap or ""] if any(map(random_weights, checkpoints.values())) else []
    demo_banner("route", random)
    print(
        msgspec.json.encode({**msgspec.to_builtins(split), **demo_label(random)}).decode()
        if args.json
        else render(split, policy)
    )
    return 0


def _calibrated(policy: Policy, path: Path) -> Policy:
    """``policy`` with the calibration at ``path``, refused (``CalibrationMismatch``) when it
    was fitted for other cheap-tier weights."""
    from cascade.build import fingerprints

    policy = with_calibration_file(policy, path)
    cheap = policy.route.cheap
    if cheap is not None:
        only = msgspec.structs.replace(policy, tiers={cheap: policy.tiers[cheap]})
        check_checkpoints(policy, fingerprints(only))
    return policy


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as handle:
        for lineno, line in enumerate(handle, 1):
            if line.strip():
                yield lineno, line


class _Source(msgspec.Struct):
    source: str = "-"


def _source_of(line: bytes) -> str:
    try:
        return msgspec.json.decode(line, type=_Source).source
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "-"


def _call(line: bytes, lineno: int) -> EngineCall:
    """A request line validated exactly as the gateway validates a body. Images are not
    decoded in a dry run: each ``images`` or ``assets`` entry stands as one (empty) image,
    which is all routing looks at."""
    env, call = text_call(line, request_id=str(lineno))
    n_images = len(env.images or []) + len(env.assets or {})
    images = [Image(data=b"", mime="image/png", width=0, height=0)] * n_images
    return msgspec.structs.replace(call, images=images)


def laya_checkpoints(policy: Policy, laya: Path | None) -> tuple[Policy, dict[str, Path]]:
    """The cheap tier's checkpoints as local paths, and the policy narrowed to those found.

    ``--laya DIR`` replaces the policy's references with a bundle's layout. Otherwise each
    reference is resolved locally (``load_policy`` already anchored relative paths).
    """
    name = policy.route.cheap
    tier = policy.tiers[name] if name else None
    if name is None or not isinstance(tier, LayaTier):
        return policy, {}
    if laya is not None:
        found: dict[str, Path] = {"english": laya}
        found |= {name: laya / sub for name, sub in SUBDIRS.items() if (laya / sub).is_dir()}
    else:
        found = {name: _resolve(ref) for name, ref in tier.checkpoints.named().items()}
    narrowed = Checkpoints.of(found)
    default = tier.default_checkpoint if tier.default_checkpoint in found else "english"
    cheap = msgspec.structs.replace(tier, checkpoints=narrowed, default_checkpoint=default)
    return msgspec.structs.replace(policy, tiers={**policy.tiers, name: cheap}), found


def _resolve(ref: str) -> Path:
    """A checkpoint directory: a local path, or a hub id already in the local cache (a dry run
    downloads nothing; pass ``--laya DIR`` otherwise)."""
    from cascade.laya.hub import resolve_checkpoint

    return resolve_checkpoint(ref, offline=True)


def _source(split: Split, source: str) -> dict[str, int]:
    return split.sources.setdefault(
        source, {"requests": 0, "questions": 0, "cheap": 0, "strong": 0, "refused": 0}
    )


def _dry(previewer: Previewing | None) -> Callable[[Ask], Reply]:
    """The dry run's replies: ``previewer``'s previews, and every tier certain."""

    def reply(ask: Ask) -> Reply:
        if isinstance(ask, TierCall):
            return certain(ask.call, ask.tier)
        assert previewer is not None, "the flow previews only when told it can"
        return previewer.preview(ask.call, checkpoint=ask.checkpoint)

    return reply


def _count(split: Split, policy: Policy, source: str, decision: Decision) -> None:
    pre, routes = decision.pre, decision.routes
    tiers = {r.tier for r in routes.values()}
    kind = "split" if len(tiers) > 1 else ("cheap" if tiers == {policy.route.cheap} else "strong")
    split.requests += 1
    split.requests_by_route[kind] += 1
    split.questions += len(routes)
    if pre.cheap_checkpoint is not None:
        split.checkpoints[pre.cheap_checkpoint] += 1
    per_source = _source(split, source)
    per_source["requests"] += 1
    for route in routes.values():
        split.questions_by_tier[route.tier] += 1
        split.reasons[route.reason or "cheap"] += 1
        per_source["questions"] += 1
        per_source["strong" if route.tier == policy.route.strong else "cheap"] += 1


def render(split: Split, policy: Policy) -> str:
    """The dry run as plain-text tables (counts and percentages)."""
    out = [
        f"{split.requests} requests, {split.questions} questions (pre-routing only: "
        "confidence escalations need inference and are not counted)",
        "",
    ]

    def table(title: str, counts: Counter[str], total: int) -> None:
        out.append(f"{title:<28}{'count':>8}{'%':>8}")
        for key, n in counts.most_common():
            out.append(f"  {key:<26}{n:>8}{_pct(n, total):>8}")
        out.append("")

    table("requests by route", split.requests_by_route, split.requests)
    table("questions by tier", split.questions_by_tier, split.questions)
    table("questions by reason", split.reasons, split.questions)
    table("requests by cheap checkpoint", split.checkpoints, split.requests)
    if split.refused:
        table("refused requests", split.refused, split.requests + sum(split.refused.values()))
    out.append(
        f"{'by source':<20}{'requests':>9}{'questions':>10}{'cheap':>8}{'strong':>8}"
        f"{'strong %':>10}{'refused':>9}"
    )
    for name, s in sorted(split.sources.items()):
        out.append(
            f"  {name:<18}{s['requests']:>9}{s['questions']:>10}{s['cheap']:>8}"
            f"{s['strong']:>8}{_pct(s['strong'], s['questions']):>10}{s['refused']:>9}"
        )
    return "\n".join(out)


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.1f}" if total else "-"
