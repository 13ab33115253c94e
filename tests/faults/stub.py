"""A stub ``/v1/systemone`` upstream whose faults a test switches at run time.

``Stub.mode`` picks what the next request gets: ``ok`` (a valid uniform answer), ``slow``
(answers after ``delay_s``), ``hang`` (accepts and never answers), ``5xx``, ``malformed`` (a 200
that is not JSON), ``404``, ``503`` (``Retry-After: 5``, as a draining server sends),
``overloaded`` (503 ``overloaded_error``), ``400``/``413``/``422`` (the request's content
refused), ``flapping`` (ok and 5xx in turn). ``/health`` answers 200 unless the mode is
``down``. ``start``/``stop`` run it under uvicorn in a thread on a fixed loopback port, so a
test can kill it and bring it back.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from typing import Any

import uvicorn

from tests.servers import free_port

ERRORS = {
    "5xx": (500, {"detail": {"error_type": "api_error", "message": "inference failed"}}),
    "404": (404, {"detail": "Not Found"}),
    "503": (503, {"detail": {"error_type": "unavailable", "message": "draining"}}),
    "overloaded": (503, {"detail": {"error_type": "overloaded_error", "message": "busy"}}),
    "400": (400, {"detail": {"error_type": "invalid_request_error", "message": "bad image"}}),
    "413": (413, {"detail": {"error_type": "tokens_exceeded", "message": "20000 tokens"}}),
    "422": (422, {"detail": [{"loc": ["body", "images", 0], "msg": "bad", "type": "value_error"}]}),
}


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """A valid System One answer to ``body``: uniform probabilities for every question."""
    answers = {}
    for qid, q in body["questions"].items():
        if q["type"] == "noul":
            answers[qid] = {"type": "noul", "noul": 0.5}
            continue
        criteria = q["criteria"]
        keys = (
            list(criteria)
            if isinstance(criteria, dict)
            else (
                [str(c) for c in criteria]
                if q["type"] == "choice"
                else [str(i) for i in range(len(criteria))]
            )
        )
        answers[qid] = {"type": q["type"], "probabilities": {k: 1 / len(keys) for k in keys}}
    return {"model": "stub-strong", "answers": answers, "usage": {"input_tokens": 7}}


class Stub:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.mode = "ok"
        self.delay_s = 1.0
        self.posts = 0
        self._flip = itertools.count()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/health":
            await _reply(send, 500 if self.mode == "down" else 200, {"status": "ok"})
            return
        self.posts += 1
        mode = self.mode
        if mode == "flapping":
            mode = "ok" if next(self._flip) % 2 else "5xx"
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "slow":
            await asyncio.sleep(self.delay_s)
        if mode == "malformed":
            await _reply(send, 200, b"<html>oops</html>")
        elif mode in ERRORS:
            status, payload = ERRORS[mode]
            headers = [(b"retry-after", b"5")] if status == 503 else []
            await _reply(send, status, payload, headers)
        else:
            await _reply(send, 200, answer(json.loads(body)))

    def start(self) -> None:
        config = uvicorn.Config(
            self,
            host="127.0.0.1",
            port=self.port,
            log_level="error",
            lifespan="off",
            timeout_graceful_shutdown=0,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "the stub upstream did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        """Kill it: the port refuses connections afterwards."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._server.force_exit = True
            self._thread.join(10)
        self._server = self._thread = None


async def _reply(
    send: Any, status: int, payload: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": content})
