"""The one typed object each request carries through the app: ``RequestContext``.

It lives in the request's ASGI scope under ``scope["state"]`` (the per-request state of the
ASGI spec and of Litestar's ``Request.state``), made once, by the first ``context_of``: the
request id, then what the front door learns on the way (the tenant of its key, the grant of its
limits, whether its answer must close the connection). ``before_send`` hooks and the access log
read the same object.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cascade.tenants.admission import Grant
    from cascade.tenants.model import Tenant

KEY = "cascade"  # the context's key in the scope's state


@dataclass(eq=False, slots=True)
class RequestContext:
    """``request_id``: the client's ``x-request-id`` when sane, else a new one; ``tenant``:
    the key's tenant once verified (``cascade.http.tenancy``); ``grant``: the limits' grant
    once admitted; ``close``: the answer closes the connection (a body left unread,
    ``cascade.http.reading``)."""

    request_id: str
    tenant: Tenant | None = None
    grant: Grant | None = None
    close: bool = False


def context_of(scope: Any) -> RequestContext:
    """The request's context, made on the first call."""
    state: dict[str, Any] = scope.setdefault("state", {})
    found = state.get(KEY)
    if not isinstance(found, RequestContext):
        found = state[KEY] = RequestContext(request_id=_request_id(scope))
    return found


def context_in(scope: Any) -> RequestContext | None:
    """The request's context when one was made (the access log, outside the app)."""
    found = (scope.get("state") or {}).get(KEY)
    return found if isinstance(found, RequestContext) else None


def _request_id(scope: Any) -> str:
    incoming = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
    ok = 0 < len(incoming) <= 128 and incoming.isprintable()
    return incoming if ok else uuid.uuid4().hex
