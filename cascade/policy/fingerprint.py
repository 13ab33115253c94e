"""Content hashes of what decides answers: the policy as loaded and its calibration.

They name what is serving (``cascade_config_info``), stamp decision-log rows, and key cached
answers: two policies with one hash decide alike.
"""

from __future__ import annotations

import hashlib

import msgspec

from cascade.policy.model import Policy


def policy_hash(policy: Policy) -> str:
    """sha256 hex of the policy as loaded (calibration included), in canonical JSON. Its
    ``[rollout]`` is left out: it names another version and changes nothing this one decides."""
    plain = msgspec.to_builtins(policy)
    plain.pop("rollout")
    return hashlib.sha256(msgspec.json.encode(plain, order="sorted")).hexdigest()


def calibration_hash(policy: Policy) -> str:
    """sha256 hex of the policy's calibration (temperatures, stamped hashes, file, apply) and
    confidence thresholds; the same for every uncalibrated policy with the same thresholds."""
    fitted = (policy.calibration, policy.thresholds.confidence)
    return hashlib.sha256(msgspec.json.encode(fitted, order="sorted")).hexdigest()
