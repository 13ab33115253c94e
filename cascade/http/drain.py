"""Whether this server is draining: begun by ``cascade.http.server`` on SIGTERM, read by the app
(``/ready`` answers 503, responses close their connections). Shared explicitly: ``create_app``
and ``serve`` both receive it."""

from __future__ import annotations


class Drain:
    def __init__(self) -> None:
        self.active = False

    def begin(self) -> None:
        self.active = True
