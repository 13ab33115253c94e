"""cascade.overrides.h11 against the installed h11: the receive buffer measures a head, and the
words of its head-too-long error are the ones ``is_head_too_long`` looks for."""

from __future__ import annotations

import h11
import pytest

from cascade.overrides.h11 import buffered, is_head_too_long

HEAD = b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"


def test_the_buffer_shrinks_by_the_head_parsed_from_it() -> None:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(HEAD + b"{}GET /next")
    before = buffered(conn)
    assert isinstance(conn.next_event(), h11.Request)
    assert before - buffered(conn) == len(HEAD)


def test_a_head_over_the_limit_is_told_apart_from_other_errors() -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=100)
    conn.receive_data(b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 200)
    with pytest.raises(h11.RemoteProtocolError) as caught:
        conn.next_event()
    assert caught.value.error_status_hint == 431 and is_head_too_long(caught.value)
    other = h11.Connection(h11.SERVER)
    other.receive_data(b"GET / HTTP/1.1\r\n\r\n")  # no Host
    with pytest.raises(h11.RemoteProtocolError) as caught:
        other.next_event()
    assert not is_head_too_long(caught.value)
