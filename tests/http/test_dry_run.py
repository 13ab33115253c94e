"""``POST /admin/reload?dry_run=1`` (``cascade.http.dryrun``): the candidate, from the body or
the files on disk, replayed on the gateway's own decision log; it answers ``cascade replay``'s
report and changes nothing, and refuses what a reload refuses (422 ``FILE:LINE``, 409 restart
needed) before anything runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cascade import metrics
from cascade.policy.files import load_policy
from cascade.policy.fingerprint import policy_hash
from cascade.replay.run import replay
from cascade.store import read_rows
from cascade.store.postgres import safe_url
from tests.replay.helpers import ADMIN, ask, policy_text, served
from tests.servers import Postgres

N = 8
DRY = "/admin/reload?dry_run=1"


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_text(1.0))  # every question escalated: both answers logged
    return policy, tmp_path / "d.db"


@pytest.fixture
def client(files: tuple[Path, Path]) -> Iterator[httpx.Client]:
    policy, log = files
    with served(policy, log) as client:
        for n in range(N):
            ask(client, n)
        yield client


def state(client: httpx.Client) -> tuple[object, ...]:
    """What serves: the hashes, the live gate's thresholds, each answer (asking logs more
    rows, after the dry runs)."""
    health = client.get("/health", headers=ADMIN).json()["config"]
    control = client.get("/admin/control", headers=ADMIN).json()
    return health, control, metrics.CONFIG_RELOADS.collect()[0].samples


def answers(client: httpx.Client) -> list[dict[str, object]]:
    return [ask(client, n) for n in range(N)]


def test_a_dry_run_answers_the_replay_and_changes_nothing(
    client: httpx.Client, files: tuple[Path, Path], tmp_path: Path
) -> None:
    policy, log = files
    before = state(client)
    candidate = policy_text(0.7)
    r = client.post(DRY, headers=ADMIN, json={"policy": candidate})
    assert r.status_code == 200, r.text
    report = r.json()
    (tmp_path / "b.toml").write_text(candidate)
    offline = replay(
        load_policy(tmp_path / "b.toml"),
        [log],
        weights={},
        prices={"cheap": 20.0, "strong": 20.0},
        limit=1000,
    )
    assert report["dry_run"] is True and report["requests"] == N
    for key in (
        "judged",
        "not_judged",
        "strong_share",
        "tier_changes",
        "answers_changed",
        "changed",
    ):
        assert report[key] == offline[key], key
    assert report["tier_changes"]["strong_to_cheap"] > 0
    assert report["serving"]["policy_hash"] == policy_hash(load_policy(policy))
    assert report["candidate"]["policy_hash"] == offline["candidate"]["policy_hash"]
    policy.write_text(candidate)  # on disk now, not reloaded: a dry run reads what a reload would
    r = client.post(DRY + "&limit=3", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["requests"] == 3 and r.json()["truncated"] is True
    assert r.json()["candidate"]["policy_hash"] == offline["candidate"]["policy_hash"]
    assert state(client) == before
    assert {tier for a in answers(client) for tier, _ in a.values()} == {"strong"}


def test_it_changes_no_answer(client: httpx.Client, files: tuple[Path, Path]) -> None:
    first = answers(client)
    assert client.post(DRY, headers=ADMIN, json={"policy": policy_text(0.0)}).status_code == 200
    assert answers(client) == first


def test_a_candidate_that_fails_its_checks_is_422_with_file_line_lines(
    client: httpx.Client, files: tuple[Path, Path]
) -> None:
    before = state(client)
    lines = policy_text(0.7, extra="[shadow]\nfraction = 2.0\n").splitlines()
    at = lines.index("fraction = 2.0") + 1
    r = client.post(DRY, headers=ADMIN, json={"policy": "\n".join(lines)})
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["lines"] == [
        f"request.policy:{at}: error: `shadow.fraction`: Expected `float` <= 1.0"
    ]
    assert "dry run refused" in r.json()["detail"]["message"]
    r = client.post(DRY, headers=ADMIN, json={"calibration": "temperatures = 3"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["lines"][0].startswith(
        "request.calibration: error: not a cascade calibration file"
    )
    policy, _ = files
    policy.write_text("\n".join(lines))
    r = client.post(DRY, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["lines"] == [
        f"{policy}:{at}: error: `shadow.fraction`: Expected `float` <= 1.0"
    ]
    assert state(client) == before


def test_a_candidate_needing_other_engines_is_409_restart_needed(client: httpx.Client) -> None:
    r = client.post(DRY, headers=ADMIN, json={"policy": policy_text(0.7, cheap="laya2")})
    assert r.status_code == 409, r.text
    assert r.json()["detail"]["lines"][0].startswith("restart needed: tier `laya2` is new")


@pytest.mark.parametrize(
    ("query", "loc"),
    [
        ("&limit=0", "limit"),
        ("&limit=x", "limit"),
        ("&since=nan", "since"),
        ("&scope=fleet", "scope"),
    ],
)
def test_bad_query_parameters_are_422(client: httpx.Client, query: str, loc: str) -> None:
    r = client.post(DRY + query, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["query", loc]


def test_a_body_that_is_not_the_shape_is_422_and_no_key_is_401(client: httpx.Client) -> None:
    r = client.post(DRY, headers=ADMIN, json={"policy": 3})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "policy"], r.text
    assert client.post(DRY, json={}).status_code == 401


def test_without_a_decision_log_it_is_409(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_text(1.0))
    with served(policy) as client:
        r = client.post(DRY, headers=ADMIN)
    assert r.status_code == 409, r.text
    assert "keeps none" in r.json()["detail"]["message"]


def test_it_reads_a_postgresql_store(postgres: Postgres, tmp_path: Path) -> None:
    url = postgres.database("dry_run")
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_text(1.0))
    with served(policy, url) as client:
        for n in range(N):
            ask(client, n)
        for _ in range(100):  # rows may wait in the local spool a moment
            if sum(1 for _ in read_rows(url)) == 3 * N:
                break
            time.sleep(0.05)
        r = client.post(DRY, headers=ADMIN, json={"policy": policy_text(0.0)})
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["requests"] == N and report["judged"] == 3 * N
    assert report["tier_changes"] == {"cheap_to_strong": 0, "strong_to_cheap": 3 * N}
    assert report["log"] == [safe_url(url)]


KEEP_ALL = """version = 1
[stamp]
checkpoints = {}
items = 10
questions = 10
target = "escalation"
value = 0.0
[thresholds]
choice = { "3-5" = 0.0 }
score = { "3-5" = 0.0 }
noul = { "2" = 0.0 }
[temperatures]
"""


def test_a_calibration_in_the_body_applies_to_the_policy_on_disk(client: httpx.Client) -> None:
    """The serving policy escalates everything; the sent calibration keeps every answer."""
    r = client.post(DRY, headers=ADMIN, json={"calibration": KEEP_ALL})
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["tier_changes"] == {"cheap_to_strong": 0, "strong_to_cheap": 3 * N}
    assert report["candidate"]["calibration_hash"] != report["serving"]["calibration_hash"]
