"""A collector that stops answering never delays a response: spans wait in the batch
processor's bounded queue (on its own thread) while requests are answered."""

from __future__ import annotations

import httpx

from tests.servers import serve_app
from tests.tracing.helpers import BODY, app, tracing_to
from tests.tracing.receiver import run_receiver


def test_a_stalled_collector_delays_no_response(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")  # export as soon as spans end
    with run_receiver() as receiver:
        receiver.stall()
        with tracing_to(receiver.url), serve_app(app()) as url:
            first = httpx.post(url + "/v1/systemone", json=BODY)
            receiver.wait_requests(1)  # the exporter is now stuck on the collector
            later = [httpx.post(url + "/v1/systemone", json=BODY) for _ in range(20)]
            stuck = receiver.requests == 1 and not receiver.spans
            receiver.release()
    assert first.status_code == 200
    assert [r.status_code for r in later] == [200] * 20
    assert stuck  # every later answer went out while the export was held
