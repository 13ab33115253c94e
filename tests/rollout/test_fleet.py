"""Two replicas on one PostgreSQL: both join one rollout (same id, same start), and what an
admin decides on one the other applies at its next look."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from tests.audit.helpers import served
from tests.rollout.served import ALICE, ALL_STRONG, hashes, send, write


def test_an_abort_on_one_replica_reaches_the_other(tmp_path: Path, postgres: Any) -> None:
    policy = write(tmp_path, ALL_STRONG, share=0.5, interval_s=0.05)
    current, _ = hashes(tmp_path)
    url, keys = postgres.database("rollout_fleet"), str(tmp_path / "admins.toml")
    with contextlib.ExitStack() as stack:
        one, two = (
            stack.enter_context(served(policy, url, tmp_path / f"spool{n}", admin_keys_file=keys))
            for n in (1, 2)
        )
        first, second = (c.get("/admin/rollout", headers=ALICE).json() for c in (one, two))
        assert first["status"] == second["status"] == "running"
        assert (first["id"], first["started"]) == (second["id"], second["started"])
        assert one.post("/admin/rollout/abort", headers=ALICE).status_code == 200
        for _ in range(200):  # bounded: the other replica looks every 0.05 s
            if two.get("/admin/rollout", headers=ALICE).json()["status"] == "aborted":
                break
            time.sleep(0.05)
        assert two.get("/admin/rollout", headers=ALICE).json()["status"] == "aborted"
        assert {send(two, n).headers["x-cascade-policy"] for n in range(20)} == {current}
        assert two.post("/admin/rollout/promote", headers=ALICE).status_code == 409
