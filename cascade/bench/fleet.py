"""``cascade bench fleet``: N demo replicas on one Redis and one PostgreSQL, driven unevenly,
once with ``[control] scope = "replica"`` and once with ``scope = "fleet"``.

Each scope gets N fresh ``cascade serve --demo`` processes on free loopback ports, all logging to
the ``--store`` database and meeting on the ``--redis`` Redis (``CASCADE_FLEET_REDIS``, and the
``[control] url``), every one stopped at the end, on an error or Ctrl-C included. Three phases:

- **a**: one replica gets 70 % of the requests and most hard items (a 60-option question, which
  pre-routing sends strong whatever the gate: 30 % of its requests, 2 % of the others'), so
  paced alone it stays over the budget and only the others cutting deeper can make up for it;
- **b**: the mix changes: the last replica becomes the hot one, and the yes/no items drawn are
  the less confident half of the pool (more work for the gate);
- **c**: the hot replica is killed (SIGKILL) and a new one started; until it is ready its share
  goes to the survivors, then it is the hot one for ``--phase-duration`` more.

The other requests ask one yes/no question of a pool of items whose cheap answers the bench
learns first (one ``laya`` request per item). Labels are synthetic, as ``cascade bench control
--synthetic-labels``: the cheap answer with probability ``c`` (its ``answer_confidence``), else
the other option, fixed per item. After each answer, with probability ``--feedback-share``, its
label is posted to ``/v1/feedback`` on a random live replica. ``run_scope`` returns what was
recorded; ``cascade.bench.fleet_report`` turns it into the figures.

At the end of each phase the clients stop and the bench measures, with a trickle of unlabelled
requests so the replicas' control loops tick:

- **label propagation**: after one refit interval without feedback, ``PROBE`` fresh requests
  get their labels posted to one replica (the phase's hot one). ``stored_ms``: from posting a
  label until the bench reads it in PostgreSQL (``cascade.store.read_rows``: what any replica
  can read); ``refit_s``: from the first post until every live replica's gate has them (None:
  not within two refit intervals and 5 s), each replica's time in ``refit_grew``. A replica's
  gate has them when its ``GET /admin/control`` refit ``n`` of that cell grew, or when it
  applies a fleet refit (``fleet.refit.at``, Redis's clock) published after the last label was
  stored (a fleet fit reads every label in the store; at the 2000-label window ``n`` stops
  growing). A replica that refits only on its own feedback never sees the others'.
- **reload**: ``POST /admin/reload?scope=fleet`` on one replica: the round trip (the answer
  comes once every replica seen in the last minute answered, or after the reply timeout) and
  who answered.

Threshold agreement: every ``SAMPLE_S`` each live replica's ``GET /admin/control``
``thresholds``; the spread is the largest difference of one cell's threshold across replicas.
The same samples count how each replica paced (``pacing``: on the fleet's counts, or its own
when its Redis sync fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cascade.bench.control import answer_confidence, answer_label, uniform
from cascade.build import DEFAULT_POLICY
from cascade.settings import child_environment

READY_S = 600.0  # the first demo start builds and exports its tiny checkpoints
SAMPLE_S = 2.0
PROBE = 30  # labels of the propagation probe (the refit's default min_labels)
PROBE_CELL = "choice:2"
YES_NO = {"type": "choice", "criteria": ["yes", "no"]}
WIDE = {"type": "choice", "criteria": [f"o{i}" for i in range(60)]}  # pre-routed strong
HOT, COLD = 0.7, 0.3  # the hot replica's share of the requests; the others' together
HARD_HOT, HARD_COLD = 0.3, 0.02  # share of a replica's requests that are hard
PHASES = ("a", "b", "c")


@dataclass(frozen=True)
class FleetOptions:
    replicas: int = 3
    budget: float = 0.25
    target: float = 0.7
    phase_s: float = 60.0
    window_s: float = 30.0
    refit_s: float = 5.0
    clients: int = 4
    feedback_share: float = 0.5
    pool: int = 200
    seed: int = 0
    timeout_s: float = 30.0


@dataclass(frozen=True)
class PoolItem:
    state: str
    cheap: str  # the cheap tier's answer
    confidence: float
    label: str  # the synthetic truth


@dataclass(frozen=True)
class ObservedAnswer:
    t: float  # seconds from the scope's start
    phase: str
    replica: str
    hard: bool
    strong: bool
    correct: bool | None  # a kept cheap answer against its label (None: escalated or hard)


@dataclass
class Phase:
    name: str
    start: float = 0.0
    end: float = 0.0
    spreads: list[float] = field(default_factory=list)
    pacing: dict[str, int] = field(default_factory=dict)  # samples per admin/control pacing
    thresholds: dict[str, dict[str, float]] = field(default_factory=dict)  # at the end
    refits: dict[str, dict[str, Any]] = field(default_factory=dict)  # at the end
    feedback: dict[str, int] = field(default_factory=dict)  # status -> count
    stored_ms: list[float] = field(default_factory=list)
    refit_s: float | None = None
    refit_grew: dict[str, float] = field(default_factory=dict)  # replica -> s until its n grew
    reload_ms: float | None = None
    reload: dict[str, Any] = field(default_factory=dict)
    joined_s: float | None = None  # phase c: the new replica ready, from the phase start


@dataclass
class Record:
    scope: str
    replicas: list[str]
    answers: list[ObservedAnswer] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)


def policy_text(scope: str, redis: str, opts: FleetOptions) -> str:
    """The default policy with a ``[control]`` table for ``scope``."""
    return DEFAULT_POLICY.read_text(encoding="utf-8") + (
        f"\n[control]\nmax_strong_share = {opts.budget}\nwindow_s = {opts.window_s}\n"
        f'capacity = false\nscope = "{scope}"\nurl = "{redis}"\nsync_s = 0.5\n'
        f"target_accuracy = {opts.target}\nrefit_interval_s = {opts.refit_s}\n"
    )


# ---------------------------------------------------------------- replicas


@dataclass
class Replica:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    alive: bool = False


class Fleet:
    """The scope's replicas: started, killed, and all stopped by ``close``."""

    def __init__(
        self, scope: str, policy: Path, redis: str, store: str, work: Path, admin_key: str
    ) -> None:
        self.scope, self.policy, self.redis, self.store = scope, policy, redis, store
        self.work, self.admin_key = work, admin_key
        self.all: list[Replica] = []

    def live(self) -> list[Replica]:
        return [r for r in self.all if r.alive]

    def spawn(self) -> Replica:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        name = f"bench-{self.scope}-{len(self.all) + 1}-{secrets.token_hex(2)}"
        cmd = [
            sys.executable,
            "-m",
            "cascade",
            "serve",
            "--demo",
            "--policy",
            str(self.policy),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--decision-log",
            self.store,
        ]
        env = child_environment(
            {
                "CASCADE_REPLICA": name,
                "CASCADE_DECISION_SPOOL": str(self.work / f"spool-{name}"),
                "CASCADE_ADMIN_KEYS": self.admin_key,
                "CASCADE_FLEET_REDIS": self.redis,
            }
        )
        found = Replica(
            name, f"http://127.0.0.1:{port}", subprocess.Popen(cmd, env=env, cwd=self.work)
        )
        self.all.append(found)
        return found

    async def ready(self, replica: Replica) -> None:
        deadline = time.monotonic() + READY_S
        async with httpx.AsyncClient(timeout=2) as http:
            while time.monotonic() < deadline:
                if replica.proc.poll() is not None:
                    raise RuntimeError(f"{replica.name} exited with {replica.proc.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(replica.url + "/ready")).status_code == 200:
                        replica.alive = True
                        return
                await asyncio.sleep(0.3)
        raise TimeoutError(f"{replica.name} not ready within {READY_S:g} s")

    def kill(self, replica: Replica) -> None:
        replica.alive = False
        replica.proc.send_signal(signal.SIGKILL)
        replica.proc.wait()

    def close(self) -> None:
        for r in self.all:
            if r.proc.poll() is None:
                r.proc.terminate()
        for r in self.all:
            try:
                r.proc.wait(30)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()


@contextlib.asynccontextmanager
async def started(
    scope: str, redis: str, store: str, opts: FleetOptions, admin_key: str
) -> AsyncIterator[Fleet]:
    """``opts.replicas`` ready replicas (the first alone: it writes the demo checkpoints)."""
    with tempfile.TemporaryDirectory(prefix=f"cascade-bench-fleet-{scope}-") as tmp:
        work = Path(tmp)
        policy = work / "policy.toml"
        policy.write_text(policy_text(scope, redis, opts), encoding="utf-8")
        fleet = Fleet(scope, policy, redis, store, work, admin_key)
        try:
            await fleet.ready(fleet.spawn())
            others = [fleet.spawn() for _ in range(opts.replicas - 1)]
            await asyncio.gather(*(fleet.ready(r) for r in others))
            yield fleet
        finally:
            fleet.close()


# ---------------------------------------------------------------- traffic


def body(state: str, question: dict[str, Any], model: str = "jev-latest") -> dict[str, Any]:
    return {"model": model, "state": state, "questions": {"q": question}}


async def learn_pool(http: httpx.AsyncClient, url: str, opts: FleetOptions) -> list[PoolItem]:
    """The pool's items, each with its cheap answer (one cheap-only request) and label."""
    out = []
    for i in range(opts.pool):
        state = f"fleet item {opts.seed}-{i}"
        r = await http.post(url + "/v1/systemone", json=body(state, YES_NO, "laya"))
        r.raise_for_status()
        answer = r.json()["answers"]["q"]
        cheap, c = str(answer_label(answer)), answer_confidence(answer)
        right = uniform(opts.seed, state, "right") < c
        out.append(
            PoolItem(state, cheap, c, cheap if right else ("no" if cheap == "yes" else "yes"))
        )
    return out


class ScopeDriver:
    """The clients of one scope's run: which replica and item each request goes to, the
    answers, the feedback."""

    def __init__(
        self,
        fleet: Fleet,
        pool: list[PoolItem],
        opts: FleetOptions,
        record: Record,
        http: httpx.AsyncClient,
    ) -> None:
        self.fleet, self.opts, self.record, self.http = fleet, opts, record, http
        self.pool = pool
        self.rng = random.Random(opts.seed)
        self.t0 = time.monotonic()
        self.hot: Replica | None = None
        self.items = pool
        self.admin = {"authorization": f"Bearer {fleet.admin_key}"}

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _pick(self) -> tuple[Replica, bool]:
        live = self.fleet.live()
        hot = self.hot if self.hot in live else None
        cold = [r for r in live if r is not hot]
        if hot is None or not cold:
            replica = self.rng.choice(live)
        else:
            replica = hot if self.rng.random() < HOT else self.rng.choice(cold)
        return replica, self.rng.random() < (HARD_HOT if replica is hot else HARD_COLD)

    async def ask(self, phase: Phase | None) -> None:
        """One request (recorded when ``phase`` is given, with feedback by chance)."""
        replica, hard = self._pick()
        item = self.rng.choice(self.items)
        question = WIDE if hard else YES_NO
        try:
            r = await self.http.post(replica.url + "/v1/systemone", json=body(item.state, question))
        except httpx.HTTPError as exc:
            self._fail(type(exc).__name__)
            return
        if r.status_code != 200:
            self._fail(str(r.status_code))
            return
        if phase is None:
            return
        answer, cascade = r.json()["answers"]["q"], r.json()["x_cascade"]
        strong = cascade["tiers"]["q"] != "laya"
        correct = None if strong or hard else str(answer_label(answer)) == item.label
        self.record.answers.append(
            ObservedAnswer(self.now(), phase.name, replica.name, hard, strong, correct)
        )
        if not hard and self.rng.random() < self.opts.feedback_share:
            await self.label(r.headers["x-request-id"], item, phase)

    async def label(
        self, request_id: str, item: PoolItem, phase: Phase, to: Replica | None = None
    ) -> float:
        """POST the item's label for ``request_id`` to ``to`` (a random live replica); the
        monotonic time it was sent."""
        to = to or self.rng.choice(self.fleet.live())
        sent = time.monotonic()
        try:
            r = await self.http.post(
                to.url + "/v1/feedback",
                json={"request_id": request_id, "labels": {"q": item.label}},
            )
            status = str(r.status_code)
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        phase.feedback[status] = phase.feedback.get(status, 0) + 1
        return sent

    def _fail(self, why: str) -> None:
        self.record.failures[why] = self.record.failures.get(why, 0) + 1

    async def clients(
        self, phase: Phase, seconds: float, after: asyncio.Task[None] | None = None
    ) -> None:
        """The clients for ``seconds`` (from when ``after`` is done, when given)."""
        end = time.monotonic() + seconds if after is None else math.inf

        def restart(_: object) -> None:
            nonlocal end
            end = time.monotonic() + seconds

        if after is not None:
            after.add_done_callback(restart)

        async def client() -> None:
            while time.monotonic() < end:
                await self.ask(phase)

        async def sample() -> None:
            while time.monotonic() < end:
                views = (await self.control()).values()
                phase.spreads.append(spread(views))
                for view in views:
                    how = str(view.get("pacing"))
                    phase.pacing[how] = phase.pacing.get(how, 0) + 1
                await asyncio.sleep(SAMPLE_S)

        await asyncio.gather(sample(), *(client() for _ in range(self.opts.clients)))

    async def trickle(self, seconds: float) -> None:
        """One unrecorded request per live replica every 0.25 s: the control loops tick on
        requests."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for replica in self.fleet.live():
                with contextlib.suppress(httpx.HTTPError):
                    await self.http.post(
                        replica.url + "/v1/systemone", json=body(self.items[0].state, YES_NO)
                    )
            await asyncio.sleep(0.25)

    async def control(self) -> dict[str, dict[str, Any]]:
        """Each live replica's ``GET /admin/control`` (those that answer)."""
        out = {}
        for replica in self.fleet.live():
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = await self.http.get(replica.url + "/admin/control", headers=self.admin)
                if r.status_code == 200:
                    out[replica.name] = r.json()
        return out


def spread(views: Any) -> float:
    """The largest difference of one cell's threshold across ``views`` (admin/control
    answers)."""
    cells: dict[str, list[float]] = {}
    for view in views:
        for cell, value in (view.get("thresholds") or {}).items():
            cells.setdefault(cell, []).append(float(value))
    return max((max(v) - min(v) for v in cells.values() if len(v) > 1), default=0.0)


def refit_n(view: dict[str, Any]) -> int:
    return int(((view.get("refit") or {}).get(PROBE_CELL) or {}).get("n", 0))


def fleet_fit_at(view: dict[str, Any]) -> float:
    """When the fleet refit this replica applies was published (0: none, or not the fleet's)."""
    refit = (view.get("fleet") or {}).get("refit")
    return float(refit.get("at") or 0) if isinstance(refit, dict) else 0.0


# ---------------------------------------------------------------- the end of a phase


async def probe(driver: ScopeDriver, phase: Phase, store: str) -> None:
    """Label propagation (see the module docstring)."""
    opts = driver.opts
    await driver.trickle(opts.refit_s + 1)  # the feedback so far is fitted
    target = driver.hot if driver.hot in driver.fleet.live() else driver.fleet.live()[0]
    asked: list[tuple[str, PoolItem]] = []
    since = time.time() - 1
    for i in range(PROBE):
        item = driver.pool[i % len(driver.pool)]
        replica = driver.fleet.live()[i % len(driver.fleet.live())]
        with contextlib.suppress(httpx.HTTPError):
            r = await driver.http.post(replica.url + "/v1/systemone", json=body(item.state, YES_NO))
            if r.status_code == 200:
                asked.append((r.headers["x-request-id"], item))
    before = {name: refit_n(view) for name, view in (await driver.control()).items()}
    first = time.monotonic()
    for request_id, item in asked:
        sent = await driver.label(request_id, item, phase, to=target)
        seen = await asyncio.to_thread(stored, store, request_id, since)
        if seen is not None:
            phase.stored_ms.append(1000 * (seen - sent))
    labelled = time.time()  # every probe label is stored (or never will be)
    deadline = first + 2 * opts.refit_s + 5
    trickle = asyncio.create_task(driver.trickle(deadline - time.monotonic()))
    try:
        while time.monotonic() < deadline:
            views = await driver.control()
            for name, view in views.items():
                if name not in phase.refit_grew and (
                    refit_n(view) > before.get(name, 0) or fleet_fit_at(view) > labelled
                ):
                    phase.refit_grew[name] = time.monotonic() - first
            if views and set(views) <= set(phase.refit_grew):
                phase.refit_s = max(phase.refit_grew.values())
                break
            await asyncio.sleep(0.2)
    finally:
        trickle.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await trickle


def stored(store: str, request_id: str, since: float, timeout_s: float = 10.0) -> float | None:
    """The monotonic time ``request_id``'s label is first read from ``store`` (None: not
    within ``timeout_s``)."""
    from cascade.store import read_rows

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(
            row.request_id == request_id and row.label is not None
            for row in read_rows(store, since=since)
        ):
            return time.monotonic()
        time.sleep(0.01)
    return None


async def reload(driver: ScopeDriver, phase: Phase) -> None:
    """``POST /admin/reload?scope=fleet`` on one live replica: the round trip and who
    answered."""
    to = driver.fleet.live()[0]
    start = time.monotonic()
    try:
        r = await driver.http.post(to.url + "/admin/reload?scope=fleet", headers=driver.admin)
    except httpx.HTTPError as exc:
        phase.reload = {"status": type(exc).__name__}
        return
    phase.reload_ms = 1000 * (time.monotonic() - start)
    found = r.json() if r.status_code == 200 else {}
    phase.reload = {
        "status": r.status_code,
        "answered": sorted(x["replica"] for x in found.get("replicas", [])),
        "refused": found.get("refused", []),
        "not_answered": found.get("not_answered", []),
    }


async def close_phase(driver: ScopeDriver, phase: Phase, store: str) -> None:
    views = await driver.control()
    phase.thresholds = {n: v.get("thresholds") or {} for n, v in views.items()}
    phase.refits = {n: v.get("refit") or {} for n, v in views.items()}
    phase.spreads.append(spread(views.values()))
    await probe(driver, phase, store)
    await reload(driver, phase)


# ---------------------------------------------------------------- one scope


async def run_scope(scope: str, redis: str, store: str, opts: FleetOptions) -> Record:
    """The three phases on fresh replicas of ``scope``."""
    admin_key = secrets.token_urlsafe(16)
    async with (
        started(scope, redis, store, opts, admin_key) as fleet,
        httpx.AsyncClient(timeout=opts.timeout_s) as http,
    ):
        record = Record(scope, [r.name for r in fleet.all])
        pool = await learn_pool(http, fleet.all[0].url, opts)
        driver = ScopeDriver(fleet, pool, opts, record, http)
        by_confidence = sorted(pool, key=lambda p: p.confidence)
        joined: asyncio.Task[None] | None = None
        for name in PHASES:
            phase = Phase(name, start=driver.now())
            record.phases.append(phase)
            if name == "a":
                driver.hot = fleet.all[0]
            elif name == "b":
                driver.hot = fleet.all[-1]
                driver.items = by_confidence[: max(1, len(pool) // 2)]
            else:
                fleet.kill(driver.hot)  # type: ignore[arg-type]
                joining = fleet.spawn()
                record.replicas.append(joining.name)
                driver.hot = joining

                async def join(joining: Replica = joining, phase: Phase = phase) -> None:
                    await fleet.ready(joining)
                    phase.joined_s = driver.now() - phase.start

                joined = asyncio.create_task(join())
            await driver.clients(phase, opts.phase_s, joined)
            phase.end = driver.now()
            if joined is not None:
                await joined
            await close_phase(driver, phase, store)
        return record


def run(redis: str, store: str, opts: FleetOptions) -> list[Record]:
    """Both scopes, the per-replica one first."""
    return [asyncio.run(run_scope(scope, redis, store, opts)) for scope in ("replica", "fleet")]


@contextlib.contextmanager
def local_redis() -> Iterator[str]:
    """``redis-server`` on a free loopback port, no persistence; its URL; always stopped."""
    import shutil
    import socket

    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--loglevel",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), timeout=1),
            ):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
