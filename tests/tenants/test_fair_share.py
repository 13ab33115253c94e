"""A tenant's in-flight states against the gateway's permits, on loopback: a batch counts its
states against ``max_inflight``, so a tenant capped at 4 cannot hold the gateway's 256 permits
with four 64-state batches while another tenant is refused."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from pathlib import Path

import httpx

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import deterministic_answer
from tests.servers import serve_app
from tests.tenants.test_http import BODY, QUESTIONS, app, auth, sha

TENANTS = f"""
[[tenant]]
name = "batcher"
keys = ["{sha('batcher-key')}"]
max_inflight = 4

[[tenant]]
name = "single"
keys = ["{sha('single-key')}"]
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
    with serve_app(app(tmp_path, TENANTS, handler)) as url, \
            httpx.Client(base_url=url, timeout=60) as http, \
            concurrent.futures.ThreadPoolExecutor(4) as pool:
        batches = [pool.submit(http.post, "/v1/systemone/batch", json=batch,
                               headers=auth("batcher-key")) for _ in range(4)]
        for _ in range(1000):  # until the batches hold the gateway or were answered
            if entered[0] >= 256 or all(b.done() for b in batches):
                break
            time.sleep(0.01)
        singles = [http.post("/v1/systemone", json=BODY, headers=auth("single-key"))
                   for _ in range(5)]
        release.set()
        refused = [b.result() for b in batches]
    assert [r.status_code for r in singles] == [200] * 5, [r.text for r in singles[:1]]
    assert [r.status_code for r in refused] == [429] * 4
    assert "64 states in flight, over its max_inflight (4" in refused[0].text
    assert refused[0].headers["retry-after"] == "1"
