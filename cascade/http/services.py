"""What an app serves with, typed: one ``Services``, built by ``create_app``.

Route handlers take it as the ``services`` dependency (Litestar's ``Provide``); guards and
``before_send`` hooks, which dependency injection does not reach, read it with
``services_of(app)``. It is the app's only state; what belongs to one request is its
``cascade.http.context.RequestContext``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from litestar import Litestar
from prometheus_client import CollectorRegistry

from cascade.control.evidence import Learner
from cascade.control.live import LiveControl
from cascade.fleet.member import Member
from cascade.gateway import Gateway
from cascade.http.drain import Drain
from cascade.http.permits import InflightLimit
from cascade.http.reading import BodyReads
from cascade.http.reload import Access, Reloader
from cascade.http.view import GatewayView
from cascade.http.workers import DecodePool
from cascade.schema import Limits
from cascade.settings import Settings
from cascade.store.base import DecisionStore
from cascade.tenants.admission import TenantAdmission
from cascade.tenants.usage import UsageBook

KEY = "services"  # the app's one state key


@dataclass(eq=False)
class Services:
    """Built once per app. ``gateway`` drives the ``/v1`` requests; ``view`` is what
    ``/health``, ``/ready``, ``/v1/models`` and the gauges read of it; ``control``, ``learner``,
    ``decisions`` and ``usage`` are its parts the admin, feedback and usage routes use. What
    changes: ``ready`` (true while the gateway serves), ``access`` (a reload swaps it), and
    ``decode_pool``, ``tenant_admission`` and ``fleet``, made by the app's lifespans."""

    settings: Settings
    gateway: Gateway
    view: GatewayView
    control: LiveControl
    learner: Learner | None  # feedback labels go here (the live refit)
    decisions: DecisionStore | None
    usage: UsageBook
    access: Access
    reloader: Reloader
    admission: InflightLimit
    limits: Limits
    body_reads: BodyReads
    drain: Drain
    gauges: CollectorRegistry  # the gateway's gauges (cascade.http.gauges)
    ready: bool = False
    fleet: Member | None = None  # the fleet membership (cascade.http.fleet's lifespan)
    decode_pool: DecodePool = field(init=False)
    tenant_admission: TenantAdmission = field(init=False)


def services_of(app: Litestar) -> Services:
    """The ``Services`` ``app`` was built with."""
    found = app.state.get(KEY)
    if not isinstance(found, Services):
        raise LookupError("not an app made by cascade.http.app.create_app")
    return found
