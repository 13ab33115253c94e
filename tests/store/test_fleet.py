"""Real ``cascade serve --demo`` replicas sharing one PostgreSQL decision store: feedback reaches
the request whichever replica served it, scoped to its tenant; a reload under load stamps every
row with the policy that decided it; PostgreSQL stopped for 20 s under load loses no answered
row and costs no 5xx; ``kill -9`` of a replica loses no answered row; a spool whose disk fills
while PostgreSQL is down drops and counts (logged once), costs no 5xx, and replays whole."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from cascade.store import read_rows
from tests.servers import Postgres, free_port, run_process
from tests.store.helpers import small_disk

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
BODY = {
    "model": "jev-latest",
    "questions": {
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": "Payments", "tech": "Bugs", "sales": "Sales"},
        },
    },
}
KEYS = {"acme": "acme-key", "globex": "globex-key", "initech": "initech-key"}


def _keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.toml"
    digests = {name: hashlib.sha256(key.encode()).hexdigest() for name, key in KEYS.items()}
    path.write_text(
        "".join(
            f'[[tenant]]\nname = "{name}"\nkeys = ["sha256:{digest}"]\n\n'
            for name, digest in digests.items()
        )
    )
    return path


def _auth(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


def _health(base: str) -> dict[str, Any]:
    """The operator's ``/health`` (an admin key)."""
    found: dict[str, Any] = httpx.get(
        base + "/health", headers={"authorization": "Bearer admin-key"}
    ).json()
    return found


@contextlib.contextmanager
def replica(
    tmp_path: Path,
    name: str,
    url: str,
    *args: str,
    port: int | None = None,
    spool: Path | None = None,
    log: Path | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """One ``cascade serve --demo`` logging to ``url`` (its own demo directory and spool, or
    ``spool``; its output to ``log`` when given), ready; yields its base URL and process."""
    port = port or free_port()
    spool = spool or tmp_path / f"spool-{name}"
    env = {
        **os.environ,
        "CASCADE_DEMO_DIR": str(tmp_path / f"demo-{name}"),
        "CASCADE_REPLICA": name,
        "CASCADE_DECISION_SPOOL": str(spool),
        "CASCADE_API_KEYS_FILE": str(_keys_file(tmp_path)),
        "CASCADE_ADMIN_KEYS": "admin-key",
    }
    cmd = [
        str(BIN / "cascade"),
        "serve",
        "--demo",
        "--decision-log",
        url,
        "--port",
        str(port),
        "--log-level",
        "warning",
        *args,
    ]
    base = f"http://127.0.0.1:{port}"
    with run_process(cmd, ready_url=base + "/health", env=env, timeout_s=240, log_path=log) as proc:
        deadline = time.monotonic() + 240
        while httpx.get(base + "/ready").status_code != 200:
            assert time.monotonic() < deadline, "the replica never became ready"
            time.sleep(0.2)
        yield base, proc


async def _load(
    bases: list[str], stop: asyncio.Event, workers: int = 4, tenant: str = "acme"
) -> list[tuple[str, int, float, float]]:
    """Requests from ``workers`` clients, round robin over ``bases``, until ``stop``; each as
    (request id, status or 0 for a transport error, start, end) on the monotonic clock."""
    done: list[tuple[str, int, float, float]] = []

    async def worker(w: int) -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            for n in range(100_000):
                if stop.is_set():
                    return
                rid = f"w{w}-{n}"
                started = time.monotonic()
                try:
                    response = await client.post(
                        bases[(w + n) % len(bases)] + "/v1/systemone",
                        json={**BODY, "state": f"ticket {rid}"},
                        headers={"x-request-id": rid, **_auth(tenant)},
                    )
                    status = response.status_code
                except httpx.TransportError:
                    status = 0
                done.append((rid, status, started, time.monotonic()))

    await asyncio.gather(*(worker(w) for w in range(workers)))
    return done


def _run_load(
    bases: list[str], during: Any, workers: int = 4
) -> list[tuple[str, int, float, float]]:
    """Load while ``during()`` (a blocking function, run in a thread) runs, then stop."""

    async def main() -> list[tuple[str, int, float, float]]:
        stop = asyncio.Event()
        load = asyncio.create_task(_load(bases, stop, workers))
        await asyncio.to_thread(during)
        stop.set()
        return await load

    return asyncio.run(main())


def _rows(url: str) -> Counter[tuple[str, str]]:
    return Counter((r.request_id, r.question_id) for r in read_rows(url))


def test_feedback_reaches_any_replica_scoped_to_its_tenant(postgres: Postgres, tmp_path: Path):
    url = postgres.database("fleet_feedback")
    with replica(tmp_path, "a", url) as (a, _), replica(tmp_path, "b", url) as (b, _):
        for tenant in ("acme", "globex"):  # both send their ticket id: two requests
            served = httpx.post(
                a + "/v1/systemone",
                json={**BODY, "state": tenant},
                headers={"x-request-id": "ticket-1001", **_auth(tenant)},
            )
            assert served.status_code == 200, served.text
        label = {"request_id": "ticket-1001", "labels": {"urgent": True}}
        assert (
            httpx.post(b + "/v1/feedback", json=label, headers=_auth("acme")).json()["stored"] == 1
        )
        other = httpx.post(
            b + "/v1/feedback", json={**label, "labels": {"urgent": False}}, headers=_auth("globex")
        )
        assert other.status_code == 200, other.text
        stranger = httpx.post(b + "/v1/feedback", json=label, headers=_auth("initech"))
        assert stranger.status_code == 404
        for rid in ("x" * 10_000, "ticket\x00\x1b[2J"):
            bad = httpx.post(
                b + "/v1/feedback", json={**label, "request_id": rid}, headers=_auth("acme")
            )
            assert bad.status_code == 422, bad.text
            assert bad.json()["detail"][0]["loc"] == ["body", "request_id"]
    rows = [r for r in read_rows(url) if r.question_id == "urgent"]
    assert [(r.tenant, r.replica, r.label and (r.label.value, r.label.tenant)) for r in rows] == [
        ("acme", "a", (True, "acme")),
        ("globex", "a", (False, "globex")),
    ]


def test_a_reload_under_load_stamps_each_row_with_the_policy_that_decided_it(
    postgres: Postgres, tmp_path: Path
):
    url = postgres.database("fleet_reload")
    policy = tmp_path / "policy.toml"
    shutil.copy(ROOT / "policies" / "default.toml", policy)
    marks: dict[str, float] = {}
    with replica(tmp_path, "a", url, "--policy", str(policy)) as (a, proc):
        before = _health(a)["config"]["policy_hash"]

        def reload() -> None:
            time.sleep(2)
            text = policy.read_text()
            policy.write_text(text.replace('description = "', 'description = "reloaded: ', 1))
            marks["sent"] = time.monotonic()
            proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 20
            while _health(a)["config"]["policy_hash"] == before:
                assert time.monotonic() < deadline, "the reload never applied"
                time.sleep(0.05)
            marks["applied"] = time.monotonic()
            time.sleep(2)

        done = _run_load([a], reload)
        after = _health(a)["config"]["policy_hash"]
    assert after != before
    stamped = {r.request_id: r.policy_hash for r in read_rows(url)}
    answered = [d for d in done if d[1] == 200]
    early = [rid for rid, _, _, end in answered if end < marks["sent"]]
    late = [rid for rid, _, start, _ in answered if start > marks["applied"]]
    assert early and late and len(answered) == len(done)
    assert {stamped[rid] for rid in early} == {before}
    assert {stamped[rid] for rid in late} == {after}
    assert set(stamped.values()) == {before, after}


def test_postgres_stopped_20_s_under_load_loses_no_answered_row(postgres: Postgres, tmp_path: Path):
    url = postgres.database("fleet_outage")
    seen: dict[str, Any] = {}
    with replica(tmp_path, "a", url) as (a, _), replica(tmp_path, "b", url) as (b, _):

        def outage() -> None:
            time.sleep(3)
            postgres.stop()
            try:
                time.sleep(3)
                seen["health"] = _health(a)["decision_log"]
                seen["ready"] = httpx.get(a + "/ready").status_code
                seen["feedback"] = httpx.post(
                    b + "/v1/feedback",
                    headers=_auth("acme"),
                    json={"request_id": "w0-0", "labels": {"urgent": True}},
                )
                time.sleep(17)
            finally:
                postgres.start()
            deadline = time.monotonic() + 60
            for base in (a, b):
                while _health(base)["decision_log"]["behind"]:
                    assert time.monotonic() < deadline, "the spool was never replayed"
                    time.sleep(0.2)

        done = _run_load([a, b], outage)
        metrics = httpx.get(a + "/metrics", headers={"authorization": "Bearer admin-key"}).text
    statuses = Counter(status for _, status, _, _ in done)
    rows = _rows(url)
    answered = {rid for rid, status, _, _ in done if status == 200}
    print(
        f"outage: {len(done)} requests, statuses {dict(statuses)}, "
        f"{sum(rows.values())} rows, health while down {seen['health']}"
    )
    assert set(statuses) == {200} and len(answered) > 20
    assert {(rid, q) for rid in answered for q in ("urgent", "team")} <= set(rows)
    assert set(rows.values()) == {1}  # once each
    assert not seen["health"]["reachable"] and seen["health"]["behind"]
    assert seen["ready"] == 200
    assert seen["feedback"].status_code == 503 and "retry-after" in seen["feedback"].headers
    assert 'cascade_decision_log_rows_total{outcome="replayed"}' in metrics
    assert "cascade_decision_store_reachable 1.0" in metrics


def test_a_replica_killed_with_sigkill_loses_no_answered_row(postgres: Postgres, tmp_path: Path):
    url = postgres.database("fleet_kill")
    with replica(tmp_path, "a", url) as (a, proc):

        def kill() -> None:
            time.sleep(4)
            proc.send_signal(signal.SIGKILL)  # no chance to flush or close
            proc.wait(10)

        done = _run_load([a], kill)
    answered = {rid for rid, status, _, _ in done if status == 200}
    rows = _rows(url)
    print(f"kill -9: {len(done)} requests, {len(answered)} answered, {sum(rows.values())} rows")
    assert len(answered) > 10
    assert {(rid, q) for rid in answered for q in ("urgent", "team")} <= set(rows)


def test_a_full_spool_disk_drops_and_counts_logged_once_and_costs_no_5xx(
    postgres: Postgres, tmp_path: Path
):
    """PostgreSQL stopped under load with the replica's spool on a 64 KiB tmpfs: the disk fills
    (ENOSPC, not the spool's cap), later batches are dropped and counted, the warning is logged
    once, every request is a 200; back up, the spool replays whole: each row once, and exactly
    the rows not dropped."""
    url = postgres.database("fleet_spool_full")
    log = tmp_path / "replica.log"
    seen: dict[str, Any] = {}
    with (
        small_disk(tmp_path / "disk", "64k") as disk,
        replica(tmp_path, "a", url, spool=disk / "spool", log=log) as (a, _),
    ):

        def outage() -> None:
            time.sleep(1)
            postgres.stop()
            try:
                deadline = time.monotonic() + 120
                while _health(a)["decision_log"]["failed"] < 6:  # three batches dropped
                    assert time.monotonic() < deadline, "the spool's disk never filled"
                    time.sleep(0.2)
                time.sleep(1)
                seen["down"] = _health(a)["decision_log"]
            finally:
                postgres.start()
            deadline = time.monotonic() + 60
            while _health(a)["decision_log"]["behind"]:
                assert time.monotonic() < deadline, "the spool was never replayed"
                time.sleep(0.2)

        done = _run_load([a], outage, workers=2)
        health = _health(a)["decision_log"]
        metrics = httpx.get(a + "/metrics", headers={"authorization": "Bearer admin-key"}).text
    statuses = Counter(status for _, status, _, _ in done)
    answered = {rid for rid, status, _, _ in done if status == 200}
    rows = _rows(url)
    lines = log.read_text().splitlines()
    print(
        f"spool disk full: {len(done)} requests, statuses {dict(statuses)}, "
        f"{sum(rows.values())} rows, health while down {seen['down']}, after {health}"
    )
    assert set(statuses) == {200} and len(answered) > 20
    assert seen["down"]["failed"] > 0 and seen["down"]["spool_bytes"] <= 64 << 10
    assert health["failed"] >= seen["down"]["failed"]
    assert set(rows.values()) == {1}  # once each
    assert {rid for rid, _ in rows} <= answered
    assert sum(rows.values()) == 2 * len(answered) - health["failed"]  # dropped rows only
    assert health["spooled"] > 0 and health["errors"] >= 2
    assert 'cascade_decision_log_errors_total{stage="spool"}' in metrics
    full = [line for line in lines if "dropped and counted until it takes them again" in line]
    assert len(full) == 1 and "No space left on device" in full[0], lines
