"""h11's internals: the length of a connection's receive buffer, and the words of the error it
raises for a request head over ``max_incomplete_event_size``."""

from __future__ import annotations

import h11

from cascade.overrides import require

require("h11", ">=0.16,<0.17", __name__)

# h11's RemoteProtocolError for an incomplete head over max_incomplete_event_size.
HEAD_TOO_LONG = "Receive buffer too long"


def buffered(conn: h11.Connection) -> int:
    """The bytes ``conn`` received that it has not parsed into events yet: an incomplete head
    stays there whole, so the difference before and after parsing one is the head's size."""
    return len(conn._receive_buffer)


def is_head_too_long(error: h11.RemoteProtocolError) -> bool:
    """Whether ``error`` is h11's refusal of a head over ``max_incomplete_event_size``."""
    return str(error) == HEAD_TOO_LONG
