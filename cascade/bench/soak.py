"""``cascade bench soak``: honest clients beside hostile ones, for minutes, on loopback.

Honest clients send the built-in three-question request one at a time. Beside them, bounded
hostile actors repeat what earlier security rounds found harmful: slow bodies (one byte every
2 s), progressive-JPEG scan bombs, 15 MB instructions, ``Upgrade: h2c`` with the body in a later
segment (smuggling a ``GET /metrics``), large batch answers that are never read, and malformed
heads. Per window (default 2 minutes) it prints the honest clients' answers and p99 latency and
the server's RSS floor and peak: a server that holds memory after refusals shows a rising floor.
A benchmark, not a test: the figures depend on the machine.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from cascade.bench.load import DEFAULT_BODY, RssSampler, listening_pid

ROUTE = "/v1/systemone"
SLOW_SENDERS = 64
SLOW_BYTE_EVERY_S = 2.0


@dataclass
class Soak:
    host: str
    port: int
    key: str | None
    duration_s: float
    honest: list[tuple[float, int | str, float]] = field(default_factory=list)
    hostile: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    started: float = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"} if self.key else {}

    def head(self, length: int, extra: str = "") -> bytes:
        auth = f"authorization: Bearer {self.key}\r\n" if self.key else ""
        return (
            f"POST {ROUTE} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json"
            f"\r\ncontent-length: {length}\r\n{auth}{extra}\r\n"
        ).encode()

    def left(self) -> float:
        return self.started + self.duration_s - time.monotonic()


async def _honest(soak: Soak, client: httpx.AsyncClient) -> None:
    body = {"model": "jev-latest", **DEFAULT_BODY}
    while soak.left() > 0:
        started = time.monotonic()
        try:
            response = await client.post(ROUTE, json=body, headers=soak.auth())
            status: int | str = response.status_code
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        soak.honest.append((started - soak.started, status, time.monotonic() - started))
        if status != 200:
            await asyncio.sleep(0.2)


async def _every(soak: Soak, kind: str, period_s: float, action: Any) -> None:
    """Run ``action()`` every ``period_s`` until the end, counting its outcomes under ``kind``."""
    while soak.left() > 0:
        started = time.monotonic()
        try:
            outcome = await asyncio.wait_for(action(), timeout=max(1.0, soak.left() + 5))
        except (TimeoutError, OSError) as exc:
            outcome = type(exc).__name__
        soak.hostile[kind][str(outcome)] += 1
        await asyncio.sleep(max(0.0, period_s - (time.monotonic() - started)))


async def _status_of(reader: asyncio.StreamReader, timeout_s: float = 60.0) -> str:
    line = await asyncio.wait_for(reader.readline(), timeout_s)
    return line.split(b" ")[1].decode() if line.count(b" ") >= 2 else "closed"


async def _slow_sender(soak: Soak) -> None:
    """Sends a 1,000-byte body one byte at a time; reconnects when the server closes."""
    while soak.left() > 0:
        try:
            reader, writer = await asyncio.open_connection(soak.host, soak.port)
        except OSError:
            soak.hostile["slow_body"]["connect_error"] += 1
            await asyncio.sleep(1)
            continue
        try:
            writer.write(soak.head(1000))
            while soak.left() > 0 and not reader.at_eof():
                writer.write(b" ")
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    status = await _status_of(reader, SLOW_BYTE_EVERY_S)
                    soak.hostile["slow_body"][status] += 1
                    break
        except OSError:
            soak.hostile["slow_body"]["reset"] += 1
        finally:
            writer.close()


def scan_bomb(repeats: int = 2000) -> bytes:
    """A progressive JPEG whose last scan is repeated ``repeats`` times (legal, slow to decode)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (3900, 3900), (120, 30, 200)).save(out, "JPEG", progressive=True)
    data = out.getvalue()
    last = data.rindex(b"\xff\xda")
    return data[:last] + data[last:-2] * repeats + b"\xff\xd9"


async def _post_raw(soak: Soak, body: bytes) -> str:
    reader, writer = await asyncio.open_connection(soak.host, soak.port)
    try:
        writer.write(soak.head(len(body)) + body)
        await writer.drain()
        return await _status_of(reader)
    finally:
        writer.close()


async def _h2c(soak: Soak) -> str:
    """``Upgrade: h2c`` with the body in a later segment holding a second request: a server
    that answers twice was desynchronised."""
    smuggled = b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n"
    reader, writer = await asyncio.open_connection(soak.host, soak.port)
    try:
        writer.write(
            soak.head(
                len(smuggled),
                "connection: Upgrade, HTTP2-Settings\r\n"
                "upgrade: h2c\r\nhttp2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n",
            )
        )
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(smuggled)
        await writer.drain()
        seen = b""
        with contextlib.suppress(TimeoutError):
            while not reader.at_eof():
                seen += await asyncio.wait_for(reader.read(65536), 1.0)
        answers = seen.count(b"HTTP/1.1 ")
        return "desync" if answers > 1 else seen[9:12].decode() or "closed"
    finally:
        writer.close()


async def _unread_batch(soak: Soak) -> str:
    """A batch whose answer is large, sent and then never read for 20 s."""
    labels = {f"label-{i}-" + "x" * 200: None for i in range(20)}
    body = json.dumps(
        {
            "states": [f"state {i}" for i in range(64)],
            "questions": {"q": {"type": "choice", "instructions": "Which?", "criteria": labels}},
        }
    ).encode()
    reader, writer = await asyncio.open_connection(soak.host, soak.port)
    try:
        head = soak.head(len(body)).replace(ROUTE.encode(), b"/v1/systemone/batch", 1)
        writer.write(head + body)
        await writer.drain()
        await asyncio.sleep(min(20.0, max(0.0, soak.left())))
        return "held"
    finally:
        writer.close()


async def _malformed(soak: Soak) -> str:
    reader, writer = await asyncio.open_connection(soak.host, soak.port)
    try:
        writer.write(b"GARBAGE / HTTP/9\r\n\x00\x01\r\n\r\n")
        await writer.drain()
        return await _status_of(reader, 10)
    finally:
        writer.close()


async def _drive(soak: Soak, honest_clients: int) -> None:
    bomb = json.dumps(
        {
            "state": "see image",
            "images": [base64.b64encode(scan_bomb()).decode()],
            "questions": {"q": {"type": "noul", "instructions": "Is it blue?"}},
        }
    ).encode()
    big = json.dumps(
        {"state": "hi", "questions": {"q": {"type": "noul", "instructions": "x" * 15_000_000}}}
    ).encode()
    soak.started = time.monotonic()
    limits = httpx.Limits(max_connections=honest_clients)
    async with httpx.AsyncClient(base_url=soak.url, limits=limits, timeout=30.0) as client:
        await asyncio.gather(
            *(_honest(soak, client) for _ in range(honest_clients)),
            *(_slow_sender(soak) for _ in range(SLOW_SENDERS)),
            _every(soak, "scan_bomb", 5.0, lambda: _post_raw(soak, bomb)),
            _every(soak, "big_instructions", 3.0, lambda: _post_raw(soak, big)),
            _every(soak, "h2c", 2.0, lambda: _h2c(soak)),
            *(_every(soak, "unread_batch", 1.0, lambda: _unread_batch(soak)) for _ in range(4)),
            _every(soak, "malformed", 1.0, lambda: _malformed(soak)),
        )


def windows(soak: Soak, rss: list[tuple[float, float]], window_s: float) -> list[dict[str, Any]]:
    """Per window: honest answers, their p99, and the server's RSS floor and peak."""
    out = []
    count = max(1, int(-(-soak.duration_s // window_s)))
    for i in range(count):
        lo, hi = i * window_s, (i + 1) * window_s
        rows = [r for r in soak.honest if lo <= r[0] < hi]
        ok = sorted(s for _, status, s in rows if status == 200)
        mem = [v for t, v in rss if lo <= t < hi]
        out.append(
            {
                "from_s": lo,
                "to_s": min(hi, soak.duration_s),
                "honest": len(rows),
                "ok": len(ok),
                "p50_ms": round(1000 * statistics.median(ok), 1) if ok else None,
                "p99_ms": round(1000 * ok[min(len(ok) - 1, int(0.99 * len(ok)))], 1)
                if ok
                else None,
                "rss_floor_mib": min(mem) if mem else None,
                "rss_peak_mib": max(mem) if mem else None,
            }
        )
    return out


def run(
    url: str,
    *,
    duration_s: float,
    window_s: float,
    honest_clients: int,
    key: str | None = None,
    pid: int | None = None,
) -> dict[str, Any]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    pid = pid if pid is not None else listening_pid(port)
    soak = Soak(host, port, key, duration_s)
    with RssSampler(pid) as sampler:
        asyncio.run(_drive(soak, honest_clients))
    return {
        "url": url,
        "duration_s": duration_s,
        "window_s": window_s,
        "honest_clients": honest_clients,
        "server_pid": pid,
        "honest_statuses": dict(Counter(str(s) for _, s, _ in soak.honest)),
        "hostile": {k: dict(v) for k, v in sorted(soak.hostile.items())},
        "windows": windows(soak, sampler.samples, window_s),
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['url']}: {result['honest_clients']} honest clients beside hostile ones "
        f"for {result['duration_s']:g} s",
        "honest statuses: "
        + ", ".join(f"{k} {v}" for k, v in sorted(result["honest_statuses"].items())),
    ]
    for kind, outcomes in result["hostile"].items():
        lines.append(f"  {kind:<18}" + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    lines.append(
        f"{'window':<12}{'honest':>8}{'ok':>7}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'RSS floor':>11}{'RSS peak':>10}"
    )

    def cell(value: float | None, width: int) -> str:
        return f"{value:>{width}.0f}" if value is not None else f"{'-':>{width}}"

    for w in result["windows"]:
        lines.append(
            f"{w['from_s']:>4.0f}-{w['to_s']:<4.0f} s{w['honest']:>8}{w['ok']:>7}"
            f"{cell(w['p50_ms'], 9)}{cell(w['p99_ms'], 9)}"
            f"{cell(w['rss_floor_mib'], 11)}{cell(w['rss_peak_mib'], 10)}"
        )
    return "\n".join(lines)
