"""``[rollout]`` in a policy file: the candidate's path anchored at the policy file, steps that
must ascend, and a policy hash that leaves the table out."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.policy.files import PolicyError, load_policy
from cascade.policy.fingerprint import policy_hash
from tests.replay.helpers import policy_text


def test_the_candidate_is_relative_to_the_policy_file_and_the_hash_ignores_the_table(
    tmp_path: Path,
) -> None:
    (tmp_path / "plain.toml").write_text(policy_text(0.3))
    (tmp_path / "canary.toml").write_text(
        policy_text(0.3, extra='[rollout]\ncandidate = "next/c.toml"\nshare = 0.1\n')
    )
    canary = load_policy(tmp_path / "canary.toml")
    assert canary.rollout is not None
    assert canary.rollout.candidate == str(tmp_path / "next" / "c.toml")
    assert (canary.rollout.sticky, canary.rollout.guards.auto) == ("request", True)
    assert policy_hash(canary) == policy_hash(load_policy(tmp_path / "plain.toml"))


@pytest.mark.parametrize(
    ("table", "key", "says"),
    [
        ("share = 0.5\nsteps = [0.4]", "steps", "error: rollout.steps must ascend"),
        ("share = 0", "share", "error: `rollout.share`"),
        ('share = 0.1\nsticky = "replica"', "sticky", "error: `rollout.sticky`"),
    ],
)
def test_bad_rollout_tables_are_file_line_errors(
    tmp_path: Path, table: str, key: str, says: str
) -> None:
    path = tmp_path / "canary.toml"
    text = policy_text(0.3, extra=f'[rollout]\ncandidate = "c.toml"\n{table}\n')
    path.write_text(text)
    line = 1 + next(n for n, row in enumerate(text.splitlines()) if row.startswith(key))
    with pytest.raises(PolicyError) as refused:
        load_policy(path)
    assert any(m.startswith(f"{path}:{line}: {says}") for m in refused.value.messages), (
        refused.value.messages
    )
