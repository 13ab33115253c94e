"""``strong_questions_per_min`` caps every question the strong tier answers for a tenant, on
loopback: a strong-only model and pre-routed questions included, under concurrency, on an
injected clock. Over it: 429 + Retry-After in the route's error shape, or the cheap tier
standing in (flagged ``strong_quota``) where the policy allows it."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import httpx
import msgspec

from cascade import metrics
from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.http.services import services_of
from cascade.policy.model import Models
from cascade.settings import Settings
from cascade.tenants.admission import TenantAdmission
from cascade.tenants.limits import LocalStore
from tests.servers import serve_app
from tests.tenants.test_http import auth, sha
from tests.test_gateway import policy

TENANTS = f"""
[[tenant]]
name = "acme"
keys = ["{sha("acme-key")}"]
strong_questions_per_min = 5

[[tenant]]
name = "beta"
keys = ["{sha("beta-key")}"]
"""
ONE = {"urgent": {"type": "noul", "instructions": "Is it urgent?"}}
STRONG_ONLY = {"model": "clef-only", "state": "I was charged twice", "questions": ONE}
WIDE = {
    "model": "jev-latest",
    "state": "I was charged twice",
    "questions": {
        "desk": {
            "type": "choice",
            "instructions": "Which desk?",
            "criteria": [f"desk {i}" for i in range(60)],
        }
    },
}  # 60 options: pre-routed strong


def test_every_strong_answer_counts_against_the_quota(tmp_path: Path) -> None:
    """Before: 12 concurrent strong-only requests at quota 5 got 12 strong answers (the quota
    only stopped escalations). Now 5 are answered strong, 7 get 429, and one more comes back
    each 12 s; the other tenant is not affected."""
    strong: list[str] = []

    async def clef(call: EngineCall) -> EngineAnswer:
        await asyncio.sleep(0.3)  # every request is in flight at once
        strong.extend(call.questions)
        return deterministic_answer(call)

    served = msgspec.structs.replace(policy(), models=Models(strong_only=["clef-only"]))
    gateway = Gateway(served, {"laya": FakeEngine("laya"), "clef": FakeEngine("clef", clef)})
    keys = tmp_path / "keys.toml"
    keys.write_text(TENANTS)
    app = create_app(Settings(api_keys_file=str(keys)), gateway)
    clock = [0.0]
    limited = metrics.TENANT_LIMITED.labels(tenant="acme", limit="strong_questions_per_min")
    before = limited._value.get()
    with (
        serve_app(app) as url,
        httpx.Client(base_url=url, timeout=30) as http,
        concurrent.futures.ThreadPoolExecutor(12) as pool,
    ):
        services_of(app).tenant_admission = TenantAdmission(LocalStore(lambda: clock[0]))
        flood = list(
            pool.map(
                lambda _: http.post("/v1/systemone", json=STRONG_ONLY, headers=auth("acme-key")),
                range(12),
            )
        )
        decisions = http.post(
            "/v1/decisions",
            headers=auth("acme-key"),
            json={
                "model": "clef-only",
                "input": "x",
                "questions": [{"type": "predicate", "name": "urgent", "instructions": "Urgent?"}],
            },
        )
        stand_in = http.post("/v1/systemone", json=WIDE, headers=auth("acme-key"))
        other = http.post("/v1/systemone", json=STRONG_ONLY, headers=auth("beta-key"))
        clock[0] = 12.0  # one strong answer back
        again = [
            http.post("/v1/systemone", json=STRONG_ONLY, headers=auth("acme-key")) for _ in range(2)
        ]
    codes = sorted(r.status_code for r in flood)
    assert codes == [200] * 5 + [429] * 7
    refused = next(r for r in flood if r.status_code == 429)
    assert refused.headers["retry-after"] == "12"  # 5 a minute: one every 12 s
    assert refused.json() == {
        "detail": {
            "error_type": "rate_limit_exceeded",
            "message": "tenant `acme` is over its strong_questions_per_min (5); retry in 12 s",
        }
    }
    assert decisions.status_code == 429, decisions.text
    assert decisions.headers["retry-after"] == "12"
    assert decisions.json()["error"]["code"] == "rate_limit_exceeded"
    assert stand_in.status_code == 200 and stand_in.headers["x-cascade-tiers"] == "laya=1"
    assert other.status_code == 200 and other.headers["x-cascade-tiers"] == "clef=1"
    assert [r.status_code for r in again] == [200, 429]
    assert len(strong) == 5 + 1 + 1  # acme's 5, beta's 1, acme's one 12 s later
    assert limited._value.get() == before + 7 + 1 + 1  # each 429 counted
