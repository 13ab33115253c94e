"""``cascade distill --from-log``: a decision log the gateway wrote (escalations and shadow
samples, state text stored) teaches the cheap tier, the two weighted back to traffic."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from cascade.build import build_gateway, policy_from_settings
from cascade.calls import EngineCall
from cascade.cli.serve import open_decision_log
from cascade.laya.export import export
from cascade.learn.logs import escalated
from cascade.schema import Question
from cascade.settings import from_env
from cascade.store import read_rows
from tests.learn.conftest import distill, report_of
from tests.learn.generate import requests

POLICY = """
[tiers.laya]
kind = "laya"
checkpoints = {{ english = "{laya}" }}
[tiers.clef]
kind = "clef"
release = "{clef}"
device = "cpu"
timeout_s = 30.0
[route]
cheap = "laya"
strong = "clef"
[thresholds]
truncated = false
collapsed = false
[thresholds.confidence]
choice = {{ "2" = 0.6, "3-5" = 0.55, "6-10" = 0.4, "11+" = 0.3 }}
score = {{ "2" = 0.6, "3-5" = 0.4, "6-10" = 0.3 }}
noul = {{ "2" = 0.6 }}
[shadow]
fraction = 0.5
max_concurrent = 64
[decision_log]
file = "{log}"
state = "text"
"""


async def serve(policy: Path, n: int) -> None:
    """``n`` generated requests through the gateway, decisions logged, shadows awaited."""
    settings = from_env(policy=str(policy))
    policy = policy_from_settings(settings)
    decisions = open_decision_log(settings, policy)
    gateway = build_gateway(settings, policy=policy, decisions=decisions)
    await gateway.start()
    try:
        for i, raw in enumerate(requests(n, seed=2)):
            call = EngineCall(
                state=raw["state"],
                model="jev-latest",
                request_id=f"r{i}",
                questions=msgspec.convert(raw["questions"], dict[str, Question]),
            )
            await gateway.systemone(call)
        await gateway.shadows.settled()
    finally:
        await gateway.aclose()
        decisions.close()


def test_from_log_learns_from_escalations_and_shadow_samples(
    demo_dir: Path, tmp_path: Path
) -> None:
    export(demo_dir / "laya-english", progress=lambda _: None)  # the engine finds it cached
    log = tmp_path / "decisions.sqlite"
    policy = tmp_path / "policy.toml"
    policy.write_text(
        POLICY.format(laya=demo_dir / "laya-english", clef=demo_dir / "clef-flash", log=log)
    )
    asyncio.run(serve(policy, 200))
    rows = list(read_rows(log))
    final = [r for r in rows if r.cheap is not None and not escalated(r) and not r.degraded]
    shadowed = [r for r in final if r.shadow and r.strong is not None]
    raised = [r for r in rows if escalated(r) and r.strong is not None]
    assert shadowed and raised and len(shadowed) < len(final)

    run = distill(
        demo_dir,
        "--from-log",
        log,
        "--policy",
        policy,
        "--out",
        tmp_path / "new",
        "--run-dir",
        tmp_path / "run",
        "--epochs",
        "8",
    )
    assert run.code == 0, run.stderr
    report = report_of(run)
    teacher = report.meta["teacher"]
    assert teacher["rows"] == {"shadow": len(shadowed), "escalation": len(raised)}
    assert teacher["shadow_weight"] / teacher["escalation_weight"] == pytest.approx(
        len(final) / len(shadowed), rel=1e-4
    )
    assert report.meta["data"]["kind"] == "log"
    assert report.after.agreement > report.before.agreement
