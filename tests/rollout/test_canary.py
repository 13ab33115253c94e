"""A canary on a real server (``[rollout]``): each response and decision-log row names the
version that decided it, the candidate decides with its own thresholds; bad candidates and
changes while a rollout runs are refused; promote and abort by an admin, audited; the metrics of
both arms and nothing else."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest

from tests.audit.helpers import served
from tests.replay.helpers import QUESTIONS, policy_text
from tests.rollout.served import ALICE, ALL_STRONG, hashes, send, write

BOB = {"authorization": "Bearer bob-key"}


def serve(tmp: Path, db: Path | None):
    return served(tmp / "policy.toml", db, admin_keys_file=str(tmp / "admins.toml"))


def scrape(client: httpx.Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the server's ``/metrics`` (read with an admin key)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get("/metrics", headers=ALICE).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def audit(client: httpx.Client) -> list[tuple[str, str]]:
    r = client.get("/admin/audit", headers=ALICE)
    return [
        (a["action"], a["actor"]) for a in r.json()["records"] if a["action"].startswith("rollout")
    ]


def test_each_arm_decides_and_names_itself_in_headers_and_rows(tmp_path: Path) -> None:
    write(tmp_path, ALL_STRONG, share=0.5)
    current, candidate = hashes(tmp_path)
    db = tmp_path / "d.db"
    with serve(tmp_path, db) as client:
        arms = {}
        for n in range(60):
            r = send(client, n)
            tiers = set(r.json()["x_cascade"]["tiers"].values())
            arms[f"r{n}"] = r.headers["x-cascade-policy"]
            assert tiers == ({"strong"} if arms[f"r{n}"] == candidate else {"cheap"})
        assert set(arms.values()) == {current, candidate}
        status = client.get("/admin/rollout", headers=ALICE).json()
        assert (status["status"], status["share"]) == ("running", 0.5)
        assert (status["current_hash"], status["candidate_hash"]) == (current, candidate)
        samples = scrape(client)
    with sqlite3.connect(db) as conn:
        rows = dict(conn.execute("SELECT request_id, policy_hash FROM decisions"))
    assert rows == arms
    served_by = {h: sum(v == h for v in arms.values()) for h in (current, candidate)}
    for arm, digest in (("current", current), ("candidate", candidate)):
        labels = frozenset({"arm": arm, "policy_hash": digest, "outcome": "ok"}.items())
        assert samples[("cascade_rollout_requests_total", labels)] >= served_by[digest]
    assert samples[("cascade_rollout_share", frozenset())] == 0.5


@pytest.mark.parametrize(
    ("candidate", "status", "says"),
    [
        (policy_text(0.5) + "[tiers\n", 422, "candidate.toml:"),
        (
            policy_text(0.5, urls=("http://127.0.0.1:8", "http://127.0.0.1:9")),
            409,
            "restart needed",
        ),
        (
            policy_text(0.5, extra='[rollout]\ncandidate = "x.toml"\nshare = 0.1\n'),
            422,
            "[rollout] of its own",
        ),
    ],
)
def test_a_bad_candidate_is_refused_on_reload_and_nothing_changes(
    tmp_path: Path, candidate: str, status: int, says: str
) -> None:
    policy = tmp_path / "policy.toml"
    write(tmp_path, ALL_STRONG)
    text = policy.read_text()
    policy.write_text(policy_text(0.0))
    with serve(tmp_path, None) as client:
        before = send(client, 1).headers["x-cascade-policy"]
        (tmp_path / "candidate.toml").write_text(candidate)
        policy.write_text(text)
        r = client.post("/admin/reload", headers=ALICE)
        assert r.status_code == status, r.text
        assert says in r.text
        assert client.get("/admin/rollout", headers=ALICE).json()["status"] == "none"
        assert all(send(client, n).headers["x-cascade-policy"] == before for n in range(20))


def test_another_candidate_while_one_runs_is_409_and_the_same_goes_on(tmp_path: Path) -> None:
    write(tmp_path, ALL_STRONG)
    with serve(tmp_path, tmp_path / "d.db") as client:
        started = client.get("/admin/rollout", headers=ALICE).json()["started"]
        assert client.post("/admin/reload", headers=ALICE).status_code == 200
        assert client.get("/admin/rollout", headers=ALICE).json()["started"] == started
        (tmp_path / "candidate.toml").write_text(policy_text(0.9))
        r = client.post("/admin/reload", headers=ALICE)
        assert r.status_code == 409 and "a rollout is running" in r.text, r.text


def test_promote_and_abort_need_a_rollout(tmp_path: Path) -> None:
    write(tmp_path, ALL_STRONG)
    (tmp_path / "policy.toml").write_text(policy_text(0.0))
    with serve(tmp_path, None) as client:
        for action in ("promote", "abort"):
            r = client.post(f"/admin/rollout/{action}", headers=ALICE)
            assert r.status_code == 409, r.text
            assert r.json()["detail"]["error_type"] == "conflict_error"
        assert client.post("/admin/rollout/abort").status_code == 401


def test_an_admin_steps_promotes_and_aborts_each_audited_by_name(tmp_path: Path) -> None:
    write(tmp_path, ALL_STRONG, share=0.2, extra="steps = [0.6]")
    current, candidate = hashes(tmp_path)
    with serve(tmp_path, tmp_path / "d.db") as client:
        for n in range(20):
            send(client, n)
        r = client.post("/admin/rollout/promote", headers=ALICE)
        assert (r.json()["status"], r.json()["share"]) == ("running", 0.6)
        r = client.post("/admin/rollout/promote", headers=BOB)
        assert r.json()["status"] == "promoted" and r.json()["serving_hash"] == candidate
        assert {send(client, n).headers["x-cascade-policy"] for n in range(20)} == {candidate}
        labels = frozenset({"arm": "candidate", "policy_hash": candidate, "outcome": "ok"}.items())
        assert ("cascade_rollout_requests_total", labels) not in scrape(client)
        # the policy still names the candidate: a reload keeps serving it, no new rollout
        assert client.post("/admin/reload", headers=ALICE).json()["outcome"] == "unchanged"
        assert audit(client) == [
            ("rollout_start", "boot"),
            ("rollout_step", "alice"),
            ("rollout_promote", "bob"),
        ]
    # a new candidate: started by the reload, aborted by alice
    (tmp_path / "policy.toml").write_text((tmp_path / "policy.toml").read_text())
    write(tmp_path, policy_text(0.3), share=0.5)
    with serve(tmp_path, tmp_path / "d2.db") as client:
        r = client.post("/admin/rollout/abort", headers=ALICE)
        assert r.json()["status"] == "aborted" and r.json()["serving_hash"] == current
        assert {send(client, n).headers["x-cascade-policy"] for n in range(20)} == {current}
        assert audit(client) == [("rollout_start", "boot"), ("rollout_abort", "alice")]
        assert scrape(client)[("cascade_rollout_share", frozenset())] == 0.0


def test_a_batchs_states_share_one_arm(tmp_path: Path) -> None:
    write(tmp_path, ALL_STRONG, share=0.5)
    db = tmp_path / "d.db"
    with serve(tmp_path, db) as client:
        served_by = {}
        for n in range(12):
            r = client.post(
                "/v1/systemone/batch",
                json={"states": [f"a{n}", f"b{n}", f"c{n}"], "questions": QUESTIONS},
                headers={"x-request-id": f"b{n}"},
            )
            assert r.status_code == 200, r.text
            served_by[f"b{n}"] = r.headers["x-cascade-policy"]
        assert len(set(served_by.values())) == 2
    with sqlite3.connect(db) as conn:
        rows = list(conn.execute("SELECT request_id, policy_hash FROM decisions"))
    assert len(rows) == 12 * 3 * len(QUESTIONS)  # each state's rows: "b{n}/{state}"
    assert {(rid.split("/")[0], digest) for rid, digest in rows} == set(served_by.items())


def test_without_a_decision_log_only_an_admin_ends_the_rollout(tmp_path: Path) -> None:
    write(tmp_path, ALL_STRONG, share=0.5, auto=True)
    with serve(tmp_path, None) as client:
        found = client.get("/admin/rollout", headers=ALICE).json()
        assert (found["status"], found["stored"]) == ("running", False)
        assert "no decision log" in found["note"]
        assert client.post("/admin/rollout/abort", headers=ALICE).json()["status"] == "aborted"


def test_a_bad_candidate_at_boot_keeps_the_server_from_starting(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, policy_text(0.5) + "[tiers\n")
    with pytest.raises(RuntimeError, match="did not start"), serve(tmp_path, None):
        pass
    assert f"{tmp_path / 'candidate.toml'}:17: error: invalid TOML" in capfd.readouterr().err
