"""A bounded local file of batches the database could not take yet, replayed in order.

Each record is one batch (a list of write operations, msgpack), framed as its length and CRC32:
a record torn by ``kill -9`` mid-append fails its check and ends the file there (the rest was
never acknowledged). ``append`` returns once the record is fsynced, so a response waiting for it
has its rows durable on this disk. Past ``max_bytes`` a batch is refused (the caller drops and
counts it); on a full disk ``append`` raises ``OSError`` with the file as it was. ``records``
reads from ``offset`` on; ``clear`` empties the file once every record is in the database.
Records hold row keys: replaying one twice writes nothing twice.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

HEADER = struct.Struct(">II")  # payload length, crc32


class Spool:
    def __init__(self, path: str | Path, max_bytes: int) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        self.size = self._valid_size()  # a torn tail is cut off: the next append follows
        os.truncate(self.path, self.size)  # the last whole record
        self.rows = sum(rows for _, rows, _ in self.records())  # rows waiting in it

    def append(self, batch: list[Any], rows: int) -> bool:
        """Append one batch of ``rows`` rows, fsynced; False (nothing written) past the cap."""
        payload = msgspec.msgpack.encode([rows, batch])
        record = HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        if self.size + len(record) > self.max_bytes:
            return False
        # Unbuffered: a full disk fails os.write itself (or writes short), and the cut below
        # is the last word; a buffer would retry the tail on close, after the cut.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            view = memoryview(record)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, self.size)  # no half record stays behind
            raise
        finally:
            os.close(fd)
        self.size += len(record)
        self.rows += rows
        return True

    def records(self, offset: int = 0) -> Iterator[tuple[list[Any], int, int]]:
        """(batch, its rows, the offset after it) of each whole record from ``offset``."""
        with open(self.path, "rb") as f:
            f.seek(offset)
            while True:
                head = f.read(HEADER.size)
                if len(head) < HEADER.size:
                    return
                length, crc = HEADER.unpack(head)
                payload = f.read(length)
                if len(payload) < length or zlib.crc32(payload) != crc:
                    return
                rows, batch = msgspec.msgpack.decode(payload)
                yield batch, rows, f.tell()

    def clear(self) -> None:
        os.truncate(self.path, 0)
        self.size = self.rows = 0

    def _valid_size(self) -> int:
        return max((end for _, _, end in self.records()), default=0)
