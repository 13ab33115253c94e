"""A ``[rollout]``'s candidate file, read and checked as the policy file is: its errors are
``FILE:LINE`` lines naming the candidate; one that would need other engines is refused as
"restart needed", as a reload is; one with a ``[rollout]`` of its own is refused."""

from __future__ import annotations

from pathlib import Path

from cascade.errors import ConfigRejected, RestartNeeded
from cascade.policy.files import (
    Finding,
    PolicyError,
    format_finding,
    policy_of_text,
    read_policy_text,
)
from cascade.policy.model import Policy
from cascade.policy.serving import restart_reasons


def read_candidate(path: str) -> Policy:
    """The candidate policy at ``path`` (absolute: the policy file anchors it); raises
    ``ConfigRejected`` with ``FILE:LINE: error: ...`` lines."""
    try:
        text = read_policy_text(Path(path))
        candidate = policy_of_text(text, path, Path(path).parent.resolve())
    except PolicyError as exc:
        raise ConfigRejected(exc.messages) from exc
    if candidate.rollout is not None:
        nested = Finding("error", ("rollout",), "a candidate cannot have a [rollout] of its own")
        raise ConfigRejected([format_finding(path, text, nested)])
    return candidate


def refuse_restart(current: Policy, candidate: Policy, path: str) -> None:
    """``RestartNeeded`` when ``candidate`` would need engines ``current`` does not have."""
    reasons = restart_reasons(current, candidate)
    if reasons:
        raise RestartNeeded(
            [
                f"{path}: error: restart needed: the candidate cannot share this gateway's "
                f"engines: {why}"
                for why in reasons
            ]
        )
