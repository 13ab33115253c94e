"""Reload without restart: read the settings' files again, check them as at boot, and swap what
the app serves, all or nothing. SIGHUP (``cascade.http.server``) and ``POST /admin/reload``
(``cascade.http.admin``) both call ``Reloader.reload``.

A reload reads the policy file (and the calibration file it names), ``--calibration``, the API
keys file and the admin keys file, off the event loop (hashing weights for the calibration's
stamp may take a moment), one reload at a time. Any failure leaves everything as it was:
``ConfigRejected`` (422) with ``FILE[:LINE]: error: ...`` lines, or ``RestartNeeded`` (409) when
a tier's definition changed (``Gateway.reconfigure``) or the keys file's ``[limits]`` did (the
limits store is built at boot). Otherwise the gateway's ``Serving`` and
the app's keys are swapped in one step on the event loop, so every request runs start to end on
one version and none waits for a reload. Without a policy file (``--demo``, ``--upstream``,
``--laya``/``--clef``) the policy stays the one built at boot; the calibration and key files are
still read again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Literal

from cascade import metrics
from cascade.build import reread_policy
from cascade.errors import ConfigRejected, RestartNeeded
from cascade.gateway import Gateway
from cascade.policy.fingerprint import policy_hash
from cascade.policy.model import Policy
from cascade.schema import ConfigState, LastReload, ReloadReport
from cascade.settings import Secret, Settings, SettingsError
from cascade.tenants.files import KeysFileError, load_tenants
from cascade.tenants.keys import Tenants
from cascade.tenants.model import LimitsBackend

log = logging.getLogger("cascade")
Keys = frozenset[Secret]
NO_POLICY_FILE = ("no policy file (the policy is built from --demo, --upstream or --laya/--clef): "
                  "it stays as built at boot; the calibration and key files are read again")


@dataclass(eq=False)
class Access:
    """Who may call an app: the client keys' ``tenants`` and the ``admin_keys``; a reload
    swaps both in one step."""

    tenants: Tenants
    admin_keys: Keys


def limits_restart(old: LimitsBackend, new: LimitsBackend) -> list[str]:
    """Why a keys file with ``new`` as its ``[limits]`` needs a restart (none when unchanged)."""
    changed = [name for name in LimitsBackend.__struct_fields__
               if getattr(old, name) != getattr(new, name)]
    if not changed:
        return []
    return [f"restart needed: the API keys file's [limits] changes ({', '.join(changed)}; the "
            "limits store is built at boot); a reload applies keys, tenants, their limits and "
            "policies"]


class Reloader:
    """Reloads ``access`` (the app's) and ``gateway`` from the files ``settings`` names.
    ``last``: the last reload's outcome, for ``/health``."""

    def __init__(self, access: Access, settings: Settings, gateway: Gateway) -> None:
        self.access, self.settings, self.gateway = access, settings, gateway
        self.last: LastReload | None = None
        self._lock = asyncio.Lock()
        self._waiting: asyncio.Future[ReloadReport] | None = None

    def config(self) -> ConfigState:
        serving = self.gateway.serving
        return ConfigState(policy_hash=serving.policy_hash,
                           calibration_hash=serving.calibration_hash, last_reload=self.last)

    async def reload(self) -> ReloadReport:
        """Read, check and swap (see the module docstring); raises ``ConfigRejected``. At most
        one reload waits while another runs: a call made meanwhile joins the waiting one, which
        reads the files after that call was made, and gets its answer. A burst of SIGHUPs or
        requests runs one or two reloads, not one each."""
        if self._waiting is None:
            self._waiting = asyncio.ensure_future(self._next())
        return await asyncio.shield(self._waiting)  # a caller that goes away leaves it running

    async def _next(self) -> ReloadReport:
        async with self._lock:
            self._waiting = None  # this one runs: a call from now on waits for the next
            return await self._run()

    async def _run(self) -> ReloadReport:
        try:
            policy, keys, admin = await asyncio.to_thread(self._read)
            outcome = self._swap(policy, keys, admin)
        except ConfigRejected as exc:
            refused: Literal["restart_needed", "rejected"] = (
                "restart_needed" if isinstance(exc, RestartNeeded) else "rejected")
            self._count(refused, exc.lines)
            log.error("reload %s; still serving policy %s:\n  %s", refused.replace("_", " "),
                      self.gateway.serving.policy_hash[:12], "\n  ".join(exc.lines))
            raise
        self._count(outcome)
        serving = self.gateway.serving
        log.info("reload %s: serving policy %s, calibration %s", outcome,
                 serving.policy_hash[:12], serving.calibration_hash[:12])
        return ReloadReport(outcome=outcome, policy_hash=serving.policy_hash,
                            calibration_hash=serving.calibration_hash, read=self._files(),
                            note=None if self.settings.policy else NO_POLICY_FILE)

    def _read(self) -> tuple[Policy, Tenants, Keys]:
        """Every file, checked; nothing is applied here. The tenants (the client keys, their
        limits and policies) are read against the new policy."""
        policy = reread_policy(self.settings, self.gateway.policy)
        try:
            tenants = load_tenants(self.settings, policy)  # the one place a reload reads keys
            admin = self.settings.admin_key_set()
        except KeysFileError as exc:
            raise ConfigRejected(exc.messages) from exc
        except SettingsError as exc:
            raise ConfigRejected([str(exc)]) from exc
        return policy, tenants, admin

    def _swap(self, policy: Policy, tenants: Tenants,
              admin: Keys) -> Literal["applied", "unchanged"]:
        """All or nothing, with no await: ``reconfigure`` refuses before it changes anything.
        The tenants' limit counters (the app's ``tenant_admission``) carry over."""
        access = self.access
        needed = limits_restart(access.tenants.backend, tenants.backend)
        if needed:
            raise RestartNeeded(needed)
        same_policy = policy_hash(policy) == self.gateway.serving.policy_hash
        if same_policy and (tenants, admin) == (access.tenants, access.admin_keys):
            return "unchanged"
        if not same_policy:
            self.gateway.reconfigure(policy)
        access.tenants, access.admin_keys = tenants, admin
        return "applied"

    def _count(self, outcome: Literal["applied", "unchanged", "rejected", "restart_needed"],
               errors: list[str] | None = None) -> None:
        metrics.CONFIG_RELOADS.labels(outcome=outcome).inc()
        self.last = LastReload(at=time.time(), outcome=outcome, errors=errors)

    def _files(self) -> list[str]:
        settings, policy = self.settings, self.gateway.policy
        named = [("policy", settings.policy), ("calibration", policy.calibration.file),
                 ("api keys", settings.api_keys_file),
                 ("admin keys", settings.admin_keys_file)]
        return [f"{what}: {path}" for what, path in named if path]
