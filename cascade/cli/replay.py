"""``cascade replay``: a candidate policy re-decides logged requests (``cascade.replay``)."""

from __future__ import annotations

import argparse
import asyncio
import errno
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cascade.cli.errors import ConfigError, UsageError
from cascade.cli.numbers import count
from cascade.cli.usage import filter_flags, filters
from cascade.store import log_source, missing

if TYPE_CHECKING:
    from cascade.calls import EngineAnswer, EngineCall
    from cascade.policy.model import Policy
    from cascade.replay.judge import CallTier


def register(groups: dict[str, Any]) -> None:
    p = groups["<top>"].add_parser(
        "replay",
        help="re-decide logged requests under a candidate policy, against what was served",
        description="Re-decide the requests of a decision log with the candidate policy, by the "
        "gateway's own flow, the logged tier answers standing in for the tiers (no tier is "
        "called unless --call-tiers), and compare with what was served: strong share, tier and "
        "answer changes, accuracy on labelled and shadow rows, cost. Questions it cannot judge "
        "(an answer the candidate needs was never logged, rows of an older schema, a changed "
        "tier, a tenant's own policy) are counted by reason, never guessed. Exit 0 with the "
        "report; 1 for a bad policy or log.",
    )
    p.add_argument(
        "--policy", type=Path, required=True, metavar="NEW.toml", help="the candidate policy"
    )
    p.add_argument(
        "--from-log",
        type=log_source,
        action="append",
        required=True,
        metavar="FILE|URL",
        help="a decision log (repeat for rotated files, oldest "
        "first), or a fleet's postgresql:// URL",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="apply a calibration from `cascade calibrate` to the candidate (checked "
        "against its weights)",
    )
    filter_flags(p)
    p.add_argument(
        "--limit",
        type=count,
        metavar="N",
        help="the first N requests only (oldest first, after --since)",
    )
    p.add_argument(
        "--cost",
        action="append",
        default=[],
        metavar="TIER=PRICE",
        help="price per 1000 input tokens of a tier (name, or cheap/strong); "
        "default: the policy's [cost], else laya 1, clef/upstream 20",
    )
    p.add_argument(
        "--call-tiers",
        action="store_true",
        help="ask the candidate's tiers for the answers the log lacks (their "
        "engines are started here; needs the state stored: [decision_log] state = "
        '"text") instead of counting those questions as not judged',
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument(
        "--report", type=Path, metavar="OUT.html", help="also write the report as a small HTML page"
    )
    p.set_defaults(func=replay_command)


def replay_command(args: argparse.Namespace) -> int:
    import msgspec

    from cascade.build import fingerprints
    from cascade.cli.eval import parse_costs
    from cascade.cli.summary import rounded
    from cascade.policy.calibration import check_checkpoints, with_calibration_file
    from cascade.policy.costs import costs
    from cascade.policy.files import load_policy
    from cascade.replay.report import html, table
    from cascade.replay.run import replay
    from cascade.store import NotADecisionLog

    prices = parse_costs(args.cost)
    if args.report is not None and args.report.suffix.lower() != ".html":
        raise UsageError(f"--report writes HTML: name a .html file, not {args.report}")
    for path in missing(args.from_log):
        raise FileNotFoundError(errno.ENOENT, "no such file", path)
    policy = load_policy(args.policy)
    if args.calibration is not None:
        policy = with_calibration_file(policy, args.calibration)
    weights = fingerprints(policy)
    if args.calibration is not None:
        check_checkpoints(policy, weights)

    def run(call_tier: CallTier | None) -> dict[str, Any]:
        return replay(
            policy,
            args.from_log,
            weights=weights,
            prices=costs(policy, prices),
            limit=args.limit,
            call_tier=call_tier,
            **filters(args),
        )

    try:
        report = asyncio.run(with_tiers(policy, run)) if args.call_tiers else run(None)
    except (NotADecisionLog, ConnectionError) as exc:
        raise ConfigError(str(exc)) from None
    report["candidate"]["policy"] = str(args.policy)
    if args.report is not None:
        args.report.write_text(html(report), encoding="utf-8")
    print(msgspec.json.encode(rounded(report)).decode() if args.json else table(report))
    return 0


async def with_tiers(policy: Policy, work: Callable[[CallTier], dict[str, Any]]) -> dict[str, Any]:
    """``work`` in a worker thread, given a ``CallTier`` that asks the policy's tiers (started
    here, as the gateway builds them; each call under its tier's ``timeout_s``)."""
    from cascade.build import build_engine
    from cascade.errors import EngineTimeout
    from cascade.settings import from_env

    settings = from_env()
    names = [n for n in (policy.route.cheap, policy.route.strong) if n is not None]
    engines = {n: build_engine(n, policy.tiers[n], settings) for n in names}
    loop = asyncio.get_running_loop()

    async def answer(tier: str, call: EngineCall) -> EngineAnswer:
        limit = policy.tiers[tier].timeout_s
        try:
            async with asyncio.timeout(limit):
                return await engines[tier].answer(call)
        except TimeoutError:
            raise EngineTimeout(f"`{tier}` did not answer within {limit:g} s") from None

    def call_tier(tier: str, call: EngineCall) -> EngineAnswer:
        return asyncio.run_coroutine_threadsafe(answer(tier, call), loop).result()

    try:
        await asyncio.gather(*(e.start() for e in engines.values()))
        return await asyncio.to_thread(work, call_tier)
    finally:
        await asyncio.gather(*(e.aclose() for e in engines.values()), return_exceptions=True)
