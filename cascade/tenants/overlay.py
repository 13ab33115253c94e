"""A tenant's policy (``policy = "acme.toml"`` in its ``[[tenant]]`` table): a whole policy
file, or an overlay of the gateway's policy.

A file with ``[tiers]`` is a whole policy and must run the gateway's tiers (the gateway owns one
set of engines). Any other file is an overlay: each of its tables in ``OVERLAY_TABLES`` is merged
key by key onto the gateway's policy (a key it sets replaces the base's, the rest stay), and the
result is checked exactly as a policy file is, each finding at the overlay's line. An overlay's
``[calibration] file`` is relative to the overlay and applied as a policy's is.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgspec

from cascade.policy.calibration import CalibrationError, with_calibration_file
from cascade.policy.files import (
    Finding,
    PolicyError,
    check_data,
    format_finding,
    load_policy,
    read_policy_text,
)
from cascade.policy.model import Policy
from cascade.policy.toml_keys import key_lines

# The tables an overlay may set: one line each (the [control] budget joins here).
OVERLAY_TABLES = (
    "thresholds",
    "models",
    "calibration",
)


def tenant_policy(path: Path, base: Policy, *, where: str) -> Policy:
    """The policy of a tenant whose ``policy`` key (at ``where``, ``FILE:LINE``) names
    ``path``; ``PolicyError`` (``FILE:LINE: error: ...``) when it does not validate."""
    if not path.is_file():
        raise PolicyError([f"{where}: error: tenant policy {path}: no such file"])
    text = read_policy_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(
            [format_finding(str(path), text, Finding("error", (), f"invalid TOML: {exc}"))]
        ) from None
    if "tiers" in data:
        policy = load_policy(path)
        if policy.tiers != base.tiers:
            line = min((n for k, n in key_lines(text).items() if k[:1] == ("tiers",)), default=1)
            raise PolicyError(
                [
                    f"{path}:{line}: error: a tenant's policy must run the gateway's "
                    "tiers (the same [tiers] tables), or be an overlay without them"
                ]
            )
        return policy
    return _overlay(path, text, data, base)


def _overlay(path: Path, text: str, data: dict[str, Any], base: Policy) -> Policy:
    errors = [
        Finding(
            "error",
            (key,),
            f"an overlay cannot set `{key}` (it may set: "
            f"{', '.join(OVERLAY_TABLES)}; a whole policy file has [tiers])",
        )
        for key in data
        if key not in OVERLAY_TABLES
    ]
    calibration = data.get("calibration")
    if isinstance(calibration, dict) and isinstance(calibration.get("file"), str):
        calibration["file"] = str((path.parent / calibration["file"]).expanduser().resolve())
    merged = _merge(
        msgspec.to_builtins(base), {k: v for k, v in data.items() if k in OVERLAY_TABLES}
    )
    policy, found = (None, []) if errors else check_data(merged)
    errors += [f for f in found if f.severity == "error"]
    if errors or policy is None:
        raise PolicyError([format_finding(str(path), text, f) for f in errors])
    if isinstance(calibration, dict) and "file" in calibration:
        assert policy.calibration.file is not None
        try:
            policy = with_calibration_file(policy, policy.calibration.file)
        except CalibrationError as exc:
            finding = Finding("error", ("calibration", "file"), str(exc))
            raise PolicyError([format_finding(str(path), text, finding)]) from exc
    return policy


def _merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overlay``'s keys on top, tables merged key by key."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
