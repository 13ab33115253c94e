"""``POST /admin/reload?dry_run=1``: what a reload would do, replayed on the gateway's own
decision log (``cascade.replay``); nothing changes.

The candidate is the body's files (``DryRunRequest``: the policy's TOML text, its relative
paths anchored where the serving policy file lives, and optionally a calibration's text), or,
with no body, the files on disk that a reload would read. It is checked exactly as a reload
checks it (``Reloader.checked``): a file that fails is 422 with ``FILE[:LINE]: error:`` lines
(``request.policy``/``request.calibration`` for the body's), one that needs other engines 409
"restart needed"; nothing is replayed then. The replay reads the decision store (SQLite file
or PostgreSQL) in a worker thread, at most ``limit`` requests (``?limit=``, default
``DEFAULT_LIMIT``, at most ``MAX_LIMIT``), oldest first from ``?since=`` (unix seconds);
``?tenant=`` keeps one tenant's.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from litestar import Request

from cascade.build import checked_files, reread_policy
from cascade.errors import ConfigRejected, Conflict, ValidationFailed
from cascade.http.reading import read_body
from cascade.http.services import Services
from cascade.policy.calibration import (
    CalibrationError,
    apply_calibration,
    parse_calibration,
    with_calibration_file,
)
from cascade.policy.costs import costs
from cascade.policy.files import PolicyError, policy_of_text
from cascade.policy.model import Policy
from cascade.replay.run import replay
from cascade.request.validation import decode_at
from cascade.schema import DryRunRequest, dry_run_decoder
from cascade.store import log_target

DEFAULT_LIMIT = 1000
MAX_LIMIT = 20_000
POLICY_TEXT, CALIBRATION_TEXT = "request.policy", "request.calibration"


async def dry_run(request: Request, services: Services) -> dict[str, Any]:
    """The replay report of the candidate, with what serves now (module docstring)."""
    query = request.query_params
    limit = query_number(query.get("limit"), "limit", DEFAULT_LIMIT, high=MAX_LIMIT)
    since = query.get("since")
    when = None if since is None else query_number(since, "since", 0, high=math.inf, real=True)
    tenant = query.get("tenant")
    body = await read_body(request, services.settings, services.body_reads)
    sent = decode_at(dry_run_decoder, body, []) if body.strip() else DryRunRequest()
    gateway, settings = services.gateway, services.settings
    target = log_target(settings, gateway.policy)
    if not target:
        raise Conflict(
            "a dry run replays the decision log, and this gateway keeps none "
            "(set --decision-log or [decision_log] file)"
        )
    policy = await services.reloader.checked(_reader(services, sent))
    report = await asyncio.to_thread(
        replay,
        policy,
        [target],
        weights=gateway.weights,
        prices=costs(policy),
        since=when,
        tenant=tenant,
        limit=limit,
    )
    serving = gateway.serving
    return {
        "dry_run": True,
        "serving": {
            "policy_hash": serving.policy_hash,
            "calibration_hash": serving.calibration_hash,
        },
        **report,
    }


def _reader(services: Services, sent: DryRunRequest) -> Callable[[], Policy]:
    """What reads the candidate (run in a worker thread by ``Reloader.checked``)."""
    settings, serving = services.settings, services.gateway.policy

    def read() -> Policy:
        if sent.policy is None:  # the files on disk, as a reload reads them
            policy = reread_policy(settings, serving)
            source = settings.policy or "<policy>"
        else:
            base = Path(settings.policy).resolve().parent if settings.policy else Path.cwd()
            try:
                policy = policy_of_text(sent.policy, POLICY_TEXT, base)
            except PolicyError as exc:
                raise ConfigRejected(exc.messages) from exc
            source = POLICY_TEXT
        file = CALIBRATION_TEXT if sent.calibration is not None else settings.calibration or ""
        try:
            if sent.calibration is not None:
                policy = apply_calibration(
                    policy, parse_calibration(sent.calibration, file), file=file
                )
            elif sent.policy is not None and file:  # --calibration, as a reload applies it
                policy = with_calibration_file(policy, file)
        except CalibrationError as exc:
            text = str(exc).removeprefix(f"{file}: ")
            raise ConfigRejected([f"{file}: error: {text}"]) from exc
        return checked_files(policy, source)

    return read


def query_number(
    text: str | None, name: str, default: float, *, high: float, real: bool = False
) -> Any:
    """A query parameter as a whole number in [1, ``high``] (``real``: a finite number >= 0)."""
    if text is None:
        return default
    try:
        value = float(text) if real else int(text)
    except ValueError:
        value = -1
    if not (0 if real else 1) <= value <= high or not math.isfinite(value):
        bound = "a unix time in seconds" if real else f"a whole number from 1 to {high}"
        raise ValidationFailed(
            [{"loc": ["query", name], "type": "value_error", "msg": f"{name} is {bound}"}]
        )
    return value
