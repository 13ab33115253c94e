"""A small fake gateway on 127.0.0.1 for ``cascade bench control``: just the endpoints the bench
uses, with confidences it controls and a record of what it answered and was told.

``/v1/systemone``: one answer per question, confident (0.95) for questions of up to 5 options
and unsure (0.3) beyond; a cascade request escalates an answer under the live threshold (it
rises from 0.5 to 0.7 over the first
``ramp_s`` of cascade requests) to ``clef``, a cheap-only model (``laya``) never does.
``/v1/feedback`` records the labels; ``/metrics`` (with the admin key) serves
``cascade_gate_threshold{type,band}`` and ``cascade_strong_share``; ``/admin/reload`` counts
calls with the admin key (401 without).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    rid: str
    qid: str
    tier: str
    label: str  # the cheap tier's choice
    confidence: float


@dataclass
class FakeGateway:
    admin_key: str = "adm"
    ramp_s: float = 1.0
    answered: list[Answer] = field(default_factory=list)
    probes: int = 0
    feedback: list[dict[str, Any]] = field(default_factory=list)
    reloads: list[bool] = field(default_factory=list)  # whether each had the admin key
    started: float | None = None  # the first cascade request: the threshold ramp starts
    lock: threading.Lock = field(default_factory=threading.Lock)

    def threshold(self) -> float:
        if self.started is None:
            return 0.5
        return 0.5 + 0.2 * min(1.0, (time.monotonic() - self.started) / self.ramp_s)

    def strong_share(self) -> float:
        cascade = [a for a in self.answered if a.rid]
        return sum(a.tier == "clef" for a in cascade) / len(cascade) if cascade else 0.0

    def answer(self, body: dict[str, Any], rid: str) -> dict[str, Any]:
        cheap_only = body.get("model") == "laya"
        if not cheap_only and self.started is None:
            self.started = time.monotonic()
        answers, tiers, reasons = {}, {}, {}
        threshold = self.threshold()
        for qid, question in body["questions"].items():
            names = list(question["criteria"])
            confidence = 0.95 if len(names) <= 5 else 0.3
            top = int(
                hashlib.sha256(json.dumps([body["state"], qid]).encode()).hexdigest(), 16
            ) % len(names)
            rest = (1 - confidence) / (len(names) - 1)
            p = {n: round(confidence if i == top else rest, 4) for i, n in enumerate(names)}
            strong = not cheap_only and confidence < threshold
            if strong:  # the strong tier's own answer
                p = {
                    n: round(0.9 if i == 0 else 0.1 / (len(names) - 1), 4)
                    for i, n in enumerate(names)
                }
                reasons[qid] = "low_confidence"
            tiers[qid] = "clef" if strong else "laya"
            choice = max(p, key=p.__getitem__)
            answers[qid] = {
                "type": "choice",
                "choice": choice,
                "probabilities": p,
                "confidence": 0.5,
                "answer_confidence": max(p.values()),
            }
            with self.lock:
                if cheap_only:
                    self.probes += 1
                else:
                    self.answered.append(Answer(rid, qid, tiers[qid], names[top], confidence))
        return {
            "model": "fake",
            "answers": answers,
            "usage": {"input_tokens": 1, "output_tokens": 0},
            "x_cascade": {"tiers": tiers, "reasons": reasons, "degraded": {}},
        }

    def metrics(self) -> str:
        t = self.threshold()
        return (
            "# TYPE cascade_gate_threshold gauge\n"
            f'cascade_gate_threshold{{type="choice",band="3-5"}} {t}\n'
            f'cascade_gate_threshold{{type="choice",band="11+"}} {t}\n'
            "# TYPE cascade_strong_share gauge\n"
            f"cascade_strong_share {self.strong_share()}\n"
        )


def _handler(fake: FakeGateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # head and body leave at once (no 40 ms delayed ACK)
        wbufsize = 1 << 16

        def log_message(self, *args: Any) -> None:
            pass

        def _send(
            self, status: int, body: bytes, kind: str = "application/json", rid: str | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            if rid:
                self.send_header("x-request-id", rid)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/metrics":  # the operator's view: the admin key, as cascade's
                if self.headers.get("authorization") != f"Bearer {fake.admin_key}":
                    self._send(401, b"{}")
                    return
                self._send(200, fake.metrics().encode(), "text/plain; version=0.0.4")
            else:
                self._send(200 if self.path == "/ready" else 404, b"{}")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"] or 0)) or b"{}")
            rid = self.headers.get("x-request-id", "")
            if self.path == "/v1/systemone":
                self._send(200, json.dumps(fake.answer(body, rid)).encode(), rid=rid)
            elif self.path == "/v1/feedback":
                with fake.lock:
                    fake.feedback.append(body)
                self._send(200, b'{"stored": true}')
            elif self.path == "/admin/reload":
                ok = self.headers.get("authorization") == f"Bearer {fake.admin_key}"
                fake.reloads.append(ok)
                self._send(200 if ok else 401, b"{}")
            else:
                self._send(404, b"{}")

    return Handler


@contextmanager
def serving(fake: FakeGateway) -> Iterator[str]:
    """``fake`` on a free loopback port; yields its URL, stops it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
