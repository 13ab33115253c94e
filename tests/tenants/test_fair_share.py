"""A tenant's in-flight states against the gateway's permits, on loopback: a batch counts its
states against ``max_inflight``, so a tenant capped at 4 cannot hold the gateway's 256 permits
with four 64-state batches while another tenant is refused; and while a tenant waits, another
gets no more than its fair share of the permits."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from pathlib import Path

import httpx

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import deterministic_answer
from cascade.http.permits import InflightLimit
from cascade.http.services import services_of
from tests.servers import serve_app
from tests.tenants.test_http import BODY, QUESTIONS, app, auth, sha

TENANTS = f"""
[[tenant]]
name = "batcher"
keys = ["{sha("batcher-key")}"]
max_inflight = 4

[[tenant]]
name = "single"
keys = ["{sha("single-key")}"]
"""


def test_a_batch_counts_its_states_so_another_tenant_is_not_refused(tmp_path: Path) -> None:
    """Before: the four batches held all 256 permits and every single request got 503
    "gateway busy". Now each batch is 64 states against a cap of 4 (429 at once) and the
    other tenant is served."""
    release, entered = threading.Event(), [0]

    async def handler(call: EngineCall) -> EngineAnswer:
        if call.state.startswith("hold"):
            entered[0] += 1
            for _ in range(3000):  # bounded: released by the test
                if release.is_set():
                    break
                await asyncio.sleep(0.01)
        return deterministic_answer(call)

    batch = {"states": [f"hold {i}" for i in range(64)], "questions": QUESTIONS}
    with (
        serve_app(app(tmp_path, TENANTS, handler)) as url,
        httpx.Client(base_url=url, timeout=60) as http,
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):
        batches = [
            pool.submit(http.post, "/v1/systemone/batch", json=batch, headers=auth("batcher-key"))
            for _ in range(4)
        ]
        for _ in range(1000):  # until the batches hold the gateway or were answered
            if entered[0] >= 256 or all(b.done() for b in batches):
                break
            time.sleep(0.01)
        singles = [
            http.post("/v1/systemone", json=BODY, headers=auth("single-key")) for _ in range(5)
        ]
        release.set()
        refused = [b.result() for b in batches]
    assert [r.status_code for r in singles] == [200] * 5, [r.text for r in singles[:1]]
    assert [r.status_code for r in refused] == [429] * 4
    assert "64 states in flight, over its max_inflight (4" in refused[0].text
    assert refused[0].headers["retry-after"] == "1"


def test_while_a_tenant_waits_another_gets_no_more_than_its_fair_share(tmp_path: Path) -> None:
    """No max_inflight, 8 gateway permits: bulk's two 4-state batches hold them all and single
    is refused (503, now waiting). Once one batch is answered, bulk's next batch would take
    the freed permits again (before: single refused once more); now bulk holds its fair
    share (8 // 2) and single is served."""
    release = {name: threading.Event() for name in ("a", "b", "c")}
    entered = [0]

    async def handler(call: EngineCall) -> EngineAnswer:
        name = call.state.removeprefix("hold-")[:1]
        if call.state.startswith("hold-"):
            entered[0] += 1
            for _ in range(3000):  # bounded: released by the test
                if release[name].is_set():
                    break
                await asyncio.sleep(0.01)
        return deterministic_answer(call)

    tenants = TENANTS.replace("max_inflight = 4\n", "")
    server = app(tmp_path, tenants, handler)

    def batch(name: str) -> dict[str, object]:
        return {"states": [f"hold-{name}{i}" for i in range(4)], "questions": QUESTIONS}

    with (
        serve_app(server) as url,
        httpx.Client(base_url=url, timeout=60) as http,
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):
        services_of(server).admission = InflightLimit(8, clock=lambda: 0.0)  # waiting never expires
        held = [
            pool.submit(
                http.post, "/v1/systemone/batch", json=batch(name), headers=auth("batcher-key")
            )
            for name in ("a", "b")
        ]
        for _ in range(1000):  # until both batches are in the engine
            if entered[0] >= 8 or any(h.done() for h in held):
                break
            time.sleep(0.01)
        first = http.post("/v1/systemone", json=BODY, headers=auth("single-key"))
        release["a"].set()
        answered = held[0].result()
        third = pool.submit(
            http.post, "/v1/systemone/batch", json=batch("c"), headers=auth("batcher-key")
        )
        for _ in range(1000):  # until it is refused, or in the engine
            if entered[0] >= 12 or third.done():
                break
            time.sleep(0.01)
        served = http.post("/v1/systemone", json=BODY, headers=auth("single-key"))
        for event in release.values():
            event.set()
        again = third.result()
        assert held[1].result().status_code == 200
    assert first.status_code == 503 and "gateway busy (8 requests" in first.text
    assert answered.status_code == 200
    assert served.status_code == 200, served.text
    assert again.status_code == 503 and "holds its fair share (4 of 8" in again.text
    assert again.headers["retry-after"] == "1"
