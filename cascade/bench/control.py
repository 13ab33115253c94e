"""``cascade bench control``: a labelled replay in two traffic mixes, with a labeller's feedback.

Replays a labelled JSONL (the ``cascade eval`` format: ``id``, ``state``, ``questions``,
``gold``; default the bundled sample) against a gateway, ``--url`` or a ``cascade serve --demo``
it starts on loopback with a decision log (``/v1/feedback`` needs one). Two phases of
``--phase-duration`` each; what changes between them is the traffic mix: the share of *hard*
items, ``--mix 0.2,0.8`` by default. With ``--synthetic-labels`` the bench replays the items
the confidence gate decides (not those with a question of more than 10 options or a state over
1,000 characters, which pre-routing likely sends strong whatever the budget) and the hard ones
are the less confident half (their least confident cheap answer under the median: more work for
the gate); with gold labels, every item, the hard ones the longer half of the states and every
item with a question of more than 10 options. ``--concurrency`` clients send one request at a
time; after each answer, with probability ``--feedback-share``, the client posts ``POST
/v1/feedback {"request_id", "labels": {question id: label}}`` for every question, as a labeller
would.

Labels. The items' gold labels, or with ``--synthetic-labels`` labels drawn so that the cheap
tier's answer is right with probability ``f(c) = c``, ``c`` its ``answer_confidence`` (max p as
returned): random weights (the demo) have no gold worth the name, and with a known ``f`` the
right threshold is computable. The bench learns each question's cheap answer first, asking the
gateway once per item under a cheap-only model name (``--cheap-model``, default ``laya``), so
escalated questions get labels too. Each (item, question) keeps one label for the whole run (a
hash of the seed, the item and the question decides), as a labeller labels an item once.

While it runs it scrapes ``/metrics`` every ``--scrape-every`` seconds for
``cascade_gate_threshold{type,band}`` and ``cascade_strong_share``, and with ``--reloads N``
posts ``POST /admin/reload`` (``--admin-key``) N times, evenly spread. ``cascade.bench.
control_report`` turns the records into the per-phase figures, the table and the PNG. A
benchmark, not a test: it reports what the gateway did under this traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import random
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from cascade.bench.sample import SAMPLE
from cascade.build import DEFAULT_POLICY
from cascade.questions import n_options, option_band, option_names
from cascade.schema import ChoiceQuestion, Label, NoulQuestion, Question
from cascade.settings import child_environment

HARD_OPTIONS = 10  # an item with a question of more options than this is hard
# A state longer than this many characters (of its JSON) likely fills more than the cheap tier's
# rows, which pre-routing sends strong: with synthetic labels such items are not replayed.
LONG_CHARS = 1000
GAUGES = ("cascade_gate_threshold", "cascade_strong_share")


@dataclass(frozen=True)
class AskedQuestion:
    """One question of an item: its cell (``choice:3-5``) and every label it can have."""

    type: str
    cell: str
    labels: tuple[Label, ...]


@dataclass(frozen=True)
class BenchItem:
    id: str
    body: dict[str, Any]  # what is posted to /v1/systemone
    questions: dict[str, AskedQuestion]
    gold: dict[str, Label]
    hard: bool
    forced: bool = False  # likely pre-routed strong: a wide question or a long state


def _asked(question: Question) -> AskedQuestion:
    if isinstance(question, ChoiceQuestion):
        labels: tuple[Label, ...] = tuple(option_names(question))
    elif isinstance(question, NoulQuestion):
        labels = (False, True)
    else:
        labels = tuple(range(n_options(question)))
    return AskedQuestion(
        type=question.type,
        cell=f"{question.type}:{option_band(n_options(question))}",
        labels=labels,
    )


def read_items(path: Path | None, model: str) -> list[BenchItem]:
    """The items of a JSONL file (the bundled sample by default), images left out; the longer
    half of the states and every item with a question of over ``HARD_OPTIONS`` options are
    hard."""
    path = path or SAMPLE
    raw = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        entry = json.loads(line)
        if entry.get("images") or entry.get("assets") or "state" not in entry:
            continue
        try:
            questions = {q: msgspec.convert(v, Question) for q, v in entry["questions"].items()}
        except (msgspec.ValidationError, AttributeError, KeyError) as exc:
            raise SystemExit(f"{path}:{lineno}: not a request line ({exc})") from None
        raw.append((entry, questions, len(json.dumps(entry["state"]))))
    if not raw:
        raise SystemExit(f"{path}: no text request to replay")
    lengths = sorted(n for _, _, n in raw)
    median = lengths[len(lengths) // 2]
    items = []
    for i, (entry, questions, length) in enumerate(raw):
        wide = any(n_options(q) > HARD_OPTIONS for q in questions.values())
        body = {
            "model": entry.get("model", model),
            "state": entry["state"],
            "questions": entry["questions"],
        }
        items.append(
            BenchItem(
                id=str(entry.get("id", f"line-{i + 1}")),
                body=body,
                questions={q: _asked(v) for q, v in questions.items()},
                gold=dict(entry.get("gold") or {}),
                hard=wide or length > median,
                forced=wide or length > LONG_CHARS,
            )
        )
    return items


# ---------------------------------------------------------------- answers and labels


def answer_label(answer: dict[str, Any]) -> Label:
    """The label a wire answer gives (the argmax; a noul is true over 0.5)."""
    if answer["type"] == "choice":
        return str(answer["choice"])
    if answer["type"] == "noul":
        return bool(answer["noul"] > 0.5)
    probabilities = answer["probabilities"]
    return int(max(probabilities, key=probabilities.__getitem__))


def answer_confidence(answer: dict[str, Any]) -> float:
    """max p: Laya's ``answer_confidence`` extra, else from the probabilities."""
    if answer.get("answer_confidence") is not None:
        return float(answer["answer_confidence"])
    if answer["type"] == "noul":
        return max(answer["noul"], 1 - answer["noul"])
    return float(max(answer["probabilities"].values()))


def uniform(seed: int, *parts: str) -> float:
    """A stable draw in [0, 1) for ``parts``."""
    digest = hashlib.sha256(":".join([str(seed), *parts]).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def f(confidence: float) -> float:
    """The probability that a synthetic label makes the cheap answer right: ``f(c) = c``."""
    return min(1.0, max(0.0, confidence))


@dataclass(frozen=True)
class Cheap:
    """The cheap tier's answer to one question: its label and confidence."""

    label: Label
    confidence: float


def synthetic_label(seed: int, item: BenchItem, qid: str, cheap: Cheap) -> Label:
    """The cheap answer with probability ``f(c)``, else another label, the same every time."""
    if uniform(seed, item.id, qid, "right") < f(cheap.confidence):
        return cheap.label
    others = [label for label in item.questions[qid].labels if label != cheap.label]
    if not others:
        return cheap.label
    return others[int(uniform(seed, item.id, qid, "which") * len(others))]


# ---------------------------------------------------------------- what the run records


@dataclass(frozen=True)
class Answered:
    """One answered question: when (seconds from the start), in which phase, by which tier."""

    t: float
    phase: int
    item: str
    qid: str
    cell: str
    tier: str
    reason: str | None
    degraded: bool
    confidence: float
    correct: bool | None  # against its label (None: no label)
    expected: float | None  # f(c) of a kept cheap answer (synthetic labels)


@dataclass
class Run:
    """Everything one run saw; ``control_report`` summarizes it."""

    url: str
    phase_s: float
    cheap_tier: str
    answered: list[Answered] = field(default_factory=list)
    requests: list[tuple[float, int, int | str]] = field(default_factory=list)  # t, phase, status
    feedback: list[tuple[int, int | str]] = field(default_factory=list)  # phase, status
    scrapes: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    reloads: list[tuple[float, int | str]] = field(default_factory=list)
    cheap: dict[tuple[str, str], Cheap] = field(default_factory=dict)  # the probe's answers
    items: list[BenchItem] = field(default_factory=list)  # as replayed (hard ones marked)
    started: float = 0.0
    # request ids are bench-TOKEN-pPHASE-N: a second run never labels the first one's requests
    token: str = field(default_factory=lambda: secrets.token_hex(4))

    def now(self) -> float:
        return time.monotonic() - self.started


@dataclass
class ControlOptions:
    phase_s: float = 120.0
    concurrency: int = 4
    mix: tuple[float, float] = (0.2, 0.8)
    feedback_share: float = 0.5
    synthetic: bool = False
    cheap_model: str = "laya"
    cheap_tier: str = "laya"
    scrape_every_s: float = 2.0
    reloads: int = 0
    admin_key: str | None = None
    key: str | None = None
    seed: int = 0
    timeout_s: float = 30.0
    with_forced: bool = False  # synthetic labels: replay the items likely pre-routed strong too
    # The policy a demo of the bench's own serves: the default one with this [control] table.
    control: str = ""


# ---------------------------------------------------------------- the drive


def _headers(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


async def _probe(
    client: httpx.AsyncClient, items: list[BenchItem], opts: ControlOptions, run: Run
) -> None:
    """Ask the cheap tier alone for every item once: the answers synthetic labels build on."""
    gate = asyncio.Semaphore(opts.concurrency)

    async def one(item: BenchItem) -> None:
        async with gate:
            body = {**item.body, "model": opts.cheap_model}
            response = await client.post("/v1/systemone", json=body, headers=_headers(opts.key))
        if response.status_code != 200:
            raise SystemExit(
                f"--synthetic-labels needs the cheap tier's answers: model {opts.cheap_model!r} "
                f"answered {response.status_code} for item {item.id} ({response.text[:200]}); "
                "name a cheap-only model of the policy with --cheap-model"
            )
        for qid, answer in response.json()["answers"].items():
            run.cheap[(item.id, qid)] = Cheap(answer_label(answer), answer_confidence(answer))

    await asyncio.gather(*(one(item) for item in items))


def by_confidence(items: list[BenchItem], run: Run, *, forced: bool = False) -> list[BenchItem]:
    """The items the confidence gate decides (not ``forced``), the less confident half hard:
    those whose least confident cheap answer (the probe's) is under the median. A mix of them
    asks more of the gate, and so of the budget, while nothing is pre-routed strong (a budget
    under the share pre-routed strong could not be held by any gate). ``forced``: keep those
    too."""
    items = items if forced else [i for i in items if not i.forced] or items
    lowest: dict[str, float] = {}
    for (item_id, _), cheap in run.cheap.items():
        lowest[item_id] = min(cheap.confidence, lowest.get(item_id, 1.0))
    least = {i.id: lowest.get(i.id, 1.0) for i in items}
    ranked = sorted(least.values())
    median = ranked[len(ranked) // 2]
    return [dataclasses.replace(i, hard=least[i.id] < median) for i in items]


def label_of(item: BenchItem, qid: str, opts: ControlOptions, run: Run) -> Label | None:
    """The label a labeller gives ``qid`` of ``item`` (None: none)."""
    if opts.synthetic:
        cheap = run.cheap.get((item.id, qid))
        return synthetic_label(opts.seed, item, qid, cheap) if cheap is not None else None
    return item.gold.get(qid)


def _record(
    run: Run, item: BenchItem, phase: int, t: float, body: dict[str, Any], opts: ControlOptions
) -> None:
    extra = body.get("x_cascade") or {}
    tiers, reasons, degraded = (extra.get(k) or {} for k in ("tiers", "reasons", "degraded"))
    for qid, answer in body["answers"].items():
        tier = tiers.get(qid, "?")
        label = label_of(item, qid, opts, run)
        kept = tier == opts.cheap_tier and qid not in degraded
        confidence = answer_confidence(answer)
        run.answered.append(
            Answered(
                t=t,
                phase=phase,
                item=item.id,
                qid=qid,
                cell=item.questions[qid].cell,
                tier=tier,
                reason=reasons.get(qid),
                degraded=qid in degraded,
                confidence=confidence,
                correct=None if label is None else answer_label(answer) == label,
                expected=f(confidence) if kept and opts.synthetic else None,
            )
        )


async def _client(
    client: httpx.AsyncClient,
    pools: tuple[list[BenchItem], list[BenchItem]],
    worker: int,
    opts: ControlOptions,
    run: Run,
    counter: Iterator[int],
) -> None:
    rng = random.Random(f"{opts.seed}:{worker}")
    hard, easy = pools
    for phase in (1, 2):
        end = phase * opts.phase_s
        while run.now() < end:
            pool = hard if (rng.random() < opts.mix[phase - 1] and hard) or not easy else easy
            item = rng.choice(pool)
            rid = f"bench-{run.token}-p{phase}-{next(counter)}"
            headers = {**_headers(opts.key), "x-request-id": rid}
            try:
                response = await client.post("/v1/systemone", json=item.body, headers=headers)
            except httpx.HTTPError as exc:
                run.requests.append((run.now(), phase, type(exc).__name__))
                await asyncio.sleep(0.1)
                continue
            t = run.now()
            run.requests.append((t, phase, response.status_code))
            if response.status_code != 200:
                await asyncio.sleep(0.1)
                continue
            _record(run, item, phase, t, response.json(), opts)
            if rng.random() < opts.feedback_share:
                await _feedback(
                    client, item, response.headers.get("x-request-id", rid), phase, opts, run
                )


async def _feedback(
    client: httpx.AsyncClient, item: BenchItem, rid: str, phase: int, opts: ControlOptions, run: Run
) -> None:
    labels = {
        q: label for q in item.questions if (label := label_of(item, q, opts, run)) is not None
    }
    if not labels:
        return
    try:
        response = await client.post(
            "/v1/feedback", json={"request_id": rid, "labels": labels}, headers=_headers(opts.key)
        )
        run.feedback.append((phase, response.status_code))
    except httpx.HTTPError as exc:
        run.feedback.append((phase, type(exc).__name__))


def gauges(text: str) -> dict[str, float]:
    """``cascade_gate_threshold`` per ``type:band`` and ``cascade_strong_share`` (as
    ``strong_share``) from a /metrics page."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in GAUGES:
            continue
        for sample in family.samples:
            if family.name == "cascade_strong_share":
                found["strong_share"] = sample.value
            elif {"type", "band"} <= sample.labels.keys():
                found[f"{sample.labels['type']}:{sample.labels['band']}"] = sample.value
    return found


async def _scrape(client: httpx.AsyncClient, opts: ControlOptions, run: Run) -> None:
    while run.now() < 2 * opts.phase_s:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            # /metrics is the operator's: the admin key when there is one (docs/metrics.md)
            response = await client.get("/metrics", headers=_headers(opts.admin_key or opts.key))
            if response.status_code == 200:
                run.scrapes.append((run.now(), gauges(response.text)))
        await asyncio.sleep(opts.scrape_every_s)


async def _reload(client: httpx.AsyncClient, opts: ControlOptions, run: Run) -> None:
    every = 2 * opts.phase_s / (opts.reloads + 1)
    for k in range(1, opts.reloads + 1):
        await asyncio.sleep(max(0.0, k * every - run.now()))
        try:
            response = await client.post("/admin/reload", headers=_headers(opts.admin_key))
            run.reloads.append((run.now(), response.status_code))
        except httpx.HTTPError as exc:
            run.reloads.append((run.now(), type(exc).__name__))


async def drive(url: str, items: list[BenchItem], opts: ControlOptions) -> Run:
    """The probe (synthetic labels), then both phases with the scraper and the reloads."""
    run = Run(url=url, phase_s=opts.phase_s, cheap_tier=opts.cheap_tier)
    limits = httpx.Limits(
        max_connections=opts.concurrency + 2, max_keepalive_connections=opts.concurrency + 2
    )
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=opts.timeout_s) as client:
        if opts.synthetic:
            await _probe(client, items, opts, run)
            items = by_confidence(items, run, forced=opts.with_forced)
        run.items = items
        pools = ([i for i in items if i.hard], [i for i in items if not i.hard])
        counter = iter(range(1, 1 << 62))
        run.started = time.monotonic()
        tasks = [_client(client, pools, w, opts, run, counter) for w in range(opts.concurrency)]
        tasks.append(_scrape(client, opts, run))
        if opts.reloads:
            tasks.append(_reload(client, opts, run))
        await asyncio.gather(*tasks)
    return run


# ---------------------------------------------------------------- a demo of its own


def control_table(
    max_strong_share: float, target_accuracy: float, window_s: float, refit_interval_s: float
) -> str:
    """The ``[control]`` table a demo of the bench's own serves: the budget and target the
    bench judges, held by the gateway's pacer and refit."""
    return (
        f"[control]\nmax_strong_share = {max_strong_share!r}\nwindow_s = {window_s!r}\n"
        f"target_accuracy = {target_accuracy!r}\nrefit_interval_s = {refit_interval_s!r}\n"
    )


@contextlib.contextmanager
def demo_server(
    admin_key: str | None, control: str = "", timeout_s: float = 600.0
) -> Iterator[str]:
    """``cascade serve --demo`` on a free loopback port with a decision log in a temporary
    directory (and ``CASCADE_ADMIN_KEYS`` when ``admin_key``), serving the default policy with
    the ``control`` table appended (``--demo --policy``); yields its URL, stops it."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="cascade-bench-control-") as work:
        env = child_environment({"CASCADE_ADMIN_KEYS": admin_key} if admin_key else {})
        policy = Path(work) / "policy.toml"
        policy.write_text(
            DEFAULT_POLICY.read_text(encoding="utf-8") + "\n" + control, encoding="utf-8"
        )
        cmd = [
            sys.executable,
            "-m",
            "cascade",
            "serve",
            "--demo",
            "--policy",
            str(policy),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--decision-log",
            str(Path(work) / "decisions.sqlite"),
            "--log-level",
            "warning",
        ]
        print(f"starting {' '.join(cmd[1:])}", file=sys.stderr)
        proc = subprocess.Popen(cmd, env=env, cwd=work)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, proc, timeout_s)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"cascade serve --demo exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"cascade serve --demo was not ready at {url} within {timeout_s:g} s")


def run(
    url: str | None, *, requests: Path | None, opts: ControlOptions, model: str = "jev-latest"
) -> tuple[list[BenchItem], Run]:
    """Replay against ``url``, or against a demo of its own when None."""
    items = read_items(requests, model)
    if url is not None:
        done = asyncio.run(drive(url.rstrip("/"), items, opts))
        return done.items, done
    if opts.reloads and opts.admin_key is None:
        opts.admin_key = secrets.token_urlsafe(16)
    with demo_server(opts.admin_key, opts.control) as demo:
        done = asyncio.run(drive(demo, items, opts))
    return done.items, done
