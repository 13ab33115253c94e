"""A gateway on two fake tiers (``tests.replay.helpers``) whose policy names a candidate in its
``[rollout]``, served on loopback with admin keys alice and bob and a decision log (the rollout
tests')."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from cascade.policy.files import load_policy
from cascade.policy.fingerprint import policy_hash
from tests.audit.helpers import ADMIN_FILE
from tests.replay.helpers import body, policy_text

ALICE = {"authorization": "Bearer alice-key"}


def guards(**given: Any) -> str:
    """A ``[rollout.guards]`` table: ``given`` over small test values."""
    values = {
        "min_questions": 30,
        "min_labels": 10,
        "interval_s": 0.1,
        "auto": False,
        **given,
    }
    lines = "".join(
        f"{k} = {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in values.items()
    )
    return f"[rollout.guards]\n{lines}"


def write(tmp: Path, candidate: str, *, share: float = 0.5, extra: str = "", **g: Any) -> Path:
    """``tmp/policy.toml`` (every cheap answer kept) naming ``tmp/candidate.toml`` (its text
    ``candidate``) at ``share``; the admin keys file beside them. The policy's path."""
    (tmp / "candidate.toml").write_text(candidate)
    (tmp / "admins.toml").write_text(ADMIN_FILE)
    policy = tmp / "policy.toml"
    rollout = f'[rollout]\ncandidate = "candidate.toml"\nshare = {share}\n{extra}\n{guards(**g)}'
    policy.write_text(policy_text(0.0, extra=rollout))
    return policy


def hashes(tmp: Path) -> tuple[str, str]:
    """The current and the candidate policy's hashes."""
    return policy_hash(load_policy(tmp / "policy.toml")), policy_hash(
        load_policy(tmp / "candidate.toml")
    )


def send(client: httpx.Client, n: int, tenant: str = "") -> httpx.Response:
    headers = {"x-request-id": f"r{n}"}
    r = client.post("/v1/systemone", json=body(n), headers=headers)
    assert r.status_code == 200, r.text
    return r


ALL_STRONG = policy_text(1.0)  # escalates every question
