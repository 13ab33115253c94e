"""Reload without restart: read the settings' files again, check them as at boot, and swap what
the app serves, all or nothing. SIGHUP (``cascade.http.server``) and ``POST /admin/reload``
(``cascade.http.admin``) both call ``Reloader.reload``.

A reload reads the policy file (and the calibration file it names), ``--calibration``, the API
keys file and the admin keys file, and computes the next version in full (``Gateway.prepare``:
its hashes, its gate, the decision cache's identity of the weights, each hook of the gateway's),
off the event loop (hashing weights may take a moment), one reload at a time. Any failure leaves
everything as it was: ``ConfigRejected`` (422) with ``FILE[:LINE]: error: ...`` lines (a file
fails its checks, or a hook cannot apply the new policy), or ``RestartNeeded`` (409) when a
tier's definition changed or the keys file's ``[limits]`` did (the limits store is built at
boot). Otherwise the gateway's ``Serving`` and the app's keys are swapped in one step on the
event loop, with nothing left to compute or fail, so every request runs start to end on one
version and none waits for a reload or hashes anything. Without a policy file (``--demo``,
``--upstream``, ``--laya``/``--clef``) the policy stays the one built at boot; the calibration
and key files are still read again.

Every call is one audit record (``cascade.audit``, action ``reload``) by its ``actor`` (the
admin key's name, ``signal``, ``watch`` or ``fleet``): the hashes of the policy, calibration,
client keys and admin keys before and after, the policy's changed tables, the outcome. A swap
that changes a tenant's count of keys adds one ``tenant_keys_added``/``tenant_keys_removed``
record per tenant, by the actor of the call that started that reload.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from cascade import metrics
from cascade.audit.changes import key_changes, policy_changes
from cascade.audit.log import AuditLog
from cascade.build import reread_policy
from cascade.errors import ConfigRejected, RestartNeeded
from cascade.gateway import Gateway
from cascade.http.rollouts import RolloutPlan, Rollouts
from cascade.policy.fingerprint import policy_hash
from cascade.policy.model import Policy
from cascade.policy.serving import NextVersion
from cascade.schema import AuditOutcome, ConfigState, LastReload, ReloadReport
from cascade.settings import Settings, SettingsError
from cascade.tenants.admins import load_admins
from cascade.tenants.files import KeysFileError, load_tenants
from cascade.tenants.keys import Tenants
from cascade.tenants.model import LimitsBackend

log = logging.getLogger("cascade")
NO_POLICY_FILE = (
    "no policy file (the policy is built from --demo, --upstream or --laya/--clef): "
    "it stays as built at boot; the calibration and key files are read again"
)


@dataclass(eq=False)
class Access:
    """Who may call an app: the client keys' ``tenants`` and the ``admin_keys``; a reload
    swaps both in one step."""

    tenants: Tenants
    admin_keys: Tenants  # named (cascade.tenants.admins)


def limits_restart(old: LimitsBackend, new: LimitsBackend) -> list[str]:
    """Why a keys file with ``new`` as its ``[limits]`` needs a restart (none when unchanged)."""
    changed = [
        name for name in LimitsBackend.__struct_fields__ if getattr(old, name) != getattr(new, name)
    ]
    if not changed:
        return []
    return [
        f"restart needed: the API keys file's [limits] changes ({', '.join(changed)}; the "
        "limits store is built at boot); a reload applies keys, tenants, their limits and "
        "policies"
    ]


class Read(NamedTuple):
    """What a reload read and computed: the next version (None: the policy is unchanged), the
    tenants, the admin keys and what the policy's ``[rollout]`` asks for."""

    prepared: NextVersion | None
    tenants: Tenants
    admin: Tenants
    plan: RolloutPlan


class Snapshot(NamedTuple):
    """What serves, for an audit record: the policy, the client keys and the hashes."""

    policy: Policy
    tenants: Tenants
    hashes: dict[str, str]


class Reloader:
    """Reloads ``access`` (the app's) and ``gateway`` from the files ``settings`` names,
    recording each call in ``audit``. ``last``: the last reload's outcome, for ``/health``."""

    def __init__(
        self, access: Access, settings: Settings, gateway: Gateway, audit: AuditLog
    ) -> None:
        self.access, self.settings, self.gateway, self.audit = access, settings, gateway, audit
        self.last: LastReload | None = None
        self._lock = asyncio.Lock()
        self._waiting: asyncio.Future[ReloadReport] | None = None
        self.rollouts = Rollouts(settings, gateway, audit, self._lock)  # the [rollout] canary

    def config(self) -> ConfigState:
        serving = self.gateway.serving
        return ConfigState(
            policy_hash=serving.policy_hash,
            calibration_hash=serving.calibration_hash,
            last_reload=self.last,
        )

    def snapshot(self) -> Snapshot:
        serving, access = self.gateway.serving, self.access
        return Snapshot(
            self.gateway.policy,
            access.tenants,
            {
                "policy": serving.policy_hash,
                "calibration": serving.calibration_hash,
                "keys": access.tenants.fingerprint(),
                "admin_keys": access.admin_keys.fingerprint(),
            },
        )

    async def reload(self, actor: str, client: str | None = None) -> ReloadReport:
        """Read, check and swap (see the module docstring); raises ``ConfigRejected``. At most
        one reload waits while another runs: a call made meanwhile joins the waiting one, which
        reads the files after that call was made, and gets its answer. A burst of SIGHUPs or
        requests runs one or two reloads, not one each. ``actor`` (and ``client``, its
        address) made the call: each call is one audit record."""
        before = self.snapshot()
        if self._waiting is None:
            self._waiting = asyncio.ensure_future(self._next(actor, client))
        try:  # a caller that goes away leaves it running
            report = await asyncio.shield(self._waiting)
        except ConfigRejected as exc:
            self._audit(actor, client, before, "refused", "\n".join(exc.lines))
            raise
        except Exception as exc:
            self._audit(actor, client, before, "failed", str(exc))
            raise
        self._audit(actor, client, before, report.outcome, "")
        return report

    def _audit(
        self, actor: str, client: str | None, before: Snapshot, outcome: AuditOutcome, message: str
    ) -> None:
        after = self.snapshot()
        self.audit.record(
            "reload",
            actor,
            outcome,
            client=client,
            message=message,
            before=before.hashes,
            after=after.hashes,
            changed=policy_changes(before.policy, after.policy),
        )

    async def checked(self, read: Callable[[], Policy]) -> Policy:
        """The policy ``read`` gives (it raises ``ConfigRejected``), checked as a reload checks
        it (``Gateway.prepare``: ``RestartNeeded`` when it needs other engines) and applied to
        nothing; off the event loop, one at a time with reloads (``POST /admin/reload?dry_run=1``
        reads the files a reload would)."""

        def check() -> Policy:
            policy = read()
            self.gateway.prepare(policy, source=self.settings.policy or "<policy>")
            return policy

        async with self._lock:
            return await asyncio.to_thread(check)

    async def _next(self, actor: str, client: str | None) -> ReloadReport:
        async with self._lock:
            self._waiting = None  # this one runs: a call from now on waits for the next
            return await self._run(actor, client)

    async def _run(self, actor: str, client: str | None) -> ReloadReport:
        try:
            read = await asyncio.to_thread(self._read, actor)
            old = self.access.tenants
            outcome = self._swap(read, actor, client)
            for name, was, now in key_changes(old, read.tenants):
                self.audit.record(
                    "tenant_keys_added" if now > was else "tenant_keys_removed",
                    actor,
                    "applied",
                    client=client,
                    detail={"tenant": name, "keys_before": was, "keys_after": now},
                )
        except ConfigRejected as exc:
            refused: Literal["restart_needed", "rejected"] = (
                "restart_needed" if isinstance(exc, RestartNeeded) else "rejected"
            )
            self._count(refused, exc.lines)
            log.error(
                "reload %s; still serving policy %s:\n  %s",
                refused.replace("_", " "),
                self.gateway.serving.policy_hash[:12],
                "\n  ".join(exc.lines),
            )
            raise
        self._count(outcome)
        serving = self.gateway.serving
        log.info(
            "reload %s: serving policy %s, calibration %s",
            outcome,
            serving.policy_hash[:12],
            serving.calibration_hash[:12],
        )
        return ReloadReport(
            outcome=outcome,
            policy_hash=serving.policy_hash,
            calibration_hash=serving.calibration_hash,
            read=self._files(),
            note=None if self.settings.policy else NO_POLICY_FILE,
        )

    def _read(self, actor: str) -> Read:
        """Every file, checked, and the next version computed in full (``Gateway.prepare``:
        its hashes, its gate, the cache's identity of its weights); nothing is applied here.
        The tenants (the client keys, their limits and policies) are read against the new
        policy. A ``[rollout]``'s candidate is read and checked too (``Rollouts.plan``); a
        promoted rollout's candidate is the next version."""
        policy = reread_policy(self.settings, self.gateway.policy)
        plan = self.rollouts.plan(policy, actor)
        policy = plan.serve
        try:
            tenants = load_tenants(self.settings, policy)  # the one place a reload reads keys
            admin = load_admins(self.settings)
        except KeysFileError as exc:
            raise ConfigRejected(exc.messages) from exc
        except SettingsError as exc:
            raise ConfigRejected([str(exc)]) from exc
        needed = limits_restart(self.access.tenants.backend, tenants.backend)
        if needed:
            raise RestartNeeded(needed)
        same_policy = policy_hash(policy) == self.gateway.serving.policy_hash
        prepared = (
            None
            if same_policy
            else self.gateway.prepare(policy, source=self.settings.policy or "<policy>")
        )
        return Read(prepared, tenants, admin, plan)

    def _swap(self, read: Read, actor: str, client: str | None) -> Literal["applied", "unchanged"]:
        """All or nothing, with no await: everything that can fail ran in ``_read``. The
        tenants' limit counters (the app's ``tenant_admission``) carry over."""
        access = self.access
        if (
            read.prepared is None
            and read.plan.canary is self.gateway.split.canary
            and (read.tenants, read.admin) == (access.tenants, access.admin_keys)
        ):
            return "unchanged"
        if read.prepared is not None:
            self.gateway.swap(read.prepared)
        self.rollouts.install(read.plan, actor, client)
        access.tenants, access.admin_keys = read.tenants, read.admin
        return "applied"

    def _count(
        self,
        outcome: Literal["applied", "unchanged", "rejected", "restart_needed"],
        errors: list[str] | None = None,
    ) -> None:
        metrics.CONFIG_RELOADS.labels(outcome=outcome).inc()
        self.last = LastReload(at=time.time(), outcome=outcome, errors=errors)

    def _files(self) -> list[str]:
        settings, policy = self.settings, self.gateway.policy
        named = [
            ("policy", settings.policy),
            ("calibration", policy.calibration.file),
            ("api keys", settings.api_keys_file),
            ("admin keys", settings.admin_keys_file),
        ]
        return [f"{what}: {path}" for what, path in named if path]
