"""uvicorn's internals: the signals ``Server`` re-raises after shutting down, the warning its
h11 protocol logs for an upgrade it does not do, and the transport a request's cycle writes its
answer to."""

from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from cascade.overrides import require

require("uvicorn", ">=0.54,<0.55", __name__)


def forget_signal(server: uvicorn.Server, sig: int) -> None:
    """Keep ``server`` from raising ``sig`` again once it has shut down (``capture_signals``
    re-raises every signal ``handle_exit`` saw, and a re-raised SIGTERM exits 143)."""
    server._captured_signals.remove(sig)


class QuietUpgrades(H11Protocol):
    """uvicorn's h11 protocol without its warning for an ``Upgrade`` it does not do (``h2c``
    from ``curl --http2``): the request is served as HTTP/1.1, as RFC 9110 section 7.8 asks."""

    def _unsupported_upgrade_warning(self) -> None:
        pass


def answer_transport(cycle: RequestResponseCycle) -> asyncio.Transport:
    """The transport ``cycle`` writes its answer (head and body) to."""
    return cycle.transport


def route_answer(cycle: RequestResponseCycle, transport: object) -> None:
    """Make ``cycle`` write its answer to ``transport`` (anything with asyncio.Transport's
    ``write``, ``close`` and ``is_closing``)."""
    cycle.transport = transport  # type: ignore[assignment]
