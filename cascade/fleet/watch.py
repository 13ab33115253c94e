"""Reload when the watched files change (``CASCADE_WATCH_S``): one thread looks at each file's
``stat`` and ``realpath`` every ``interval_s`` and calls ``on_change`` once a change has held still
for one more look (an editor's save in several writes, or ``kubectl cp``, makes one reload).

Why polling and not inotify (``watchfiles``): a Kubernetes ConfigMap update never writes the
mounted file. The kubelet writes a new ``..2026_..`` directory, points a temporary symlink at it
and renames that over ``..data``; ``policy.toml`` stays a symlink to ``..data/policy.toml``. An
inotify watch on the file sees nothing, one on the directory sees a rename of ``..data``, and
``watchfiles`` is not in the serve lock. The file's ``realpath`` changes at the swap, and its
inode, size or mtime at an edit in place; four ``stat`` calls a second cost nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence

log = logging.getLogger("cascade")

# Per file: its path, where its symlinks lead, inode, size and mtime (ns); a missing file is
# (path, "", 0, 0, 0).
Look = tuple[tuple[str, str, int, int, int], ...]


def look(paths: Sequence[str]) -> Look:
    """What ``paths`` are now (see ``Look``)."""
    seen = []
    for path in paths:
        try:
            real = os.path.realpath(path)
            st = os.stat(real)
            seen.append((path, real, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            seen.append((path, "", 0, 0, 0))
    return tuple(seen)


class Settle:
    """Decides when a change is applied, with no I/O: ``see`` is True once a look differs from
    the last applied one and the look before it was the same (still for one interval)."""

    def __init__(self, first: Look) -> None:
        self.applied = first
        self._pending: Look | None = None

    def see(self, now: Look) -> bool:
        if now == self.applied:
            self._pending = None
            return False
        if now != self._pending:
            self._pending = now  # changed since the last look: wait for it to hold still
            return False
        self.applied, self._pending = now, None
        return True


class Watcher:
    """A daemon thread calling ``on_change()`` (from that thread) when ``paths()`` (read at each
    look: a reload may name another calibration file) settle on a change. ``stop`` joins it."""

    def __init__(
        self, paths: Callable[[], Sequence[str]], on_change: Callable[[], None], interval_s: float
    ) -> None:
        self.paths, self.on_change, self.interval_s = paths, on_change, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cascade-watch", daemon=True)

    def start(self) -> None:
        self._settle = Settle(look(self.paths()))
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            before, now = self._settle.applied, look(self.paths())
            if self._settle.see(now):
                changed = [seen[0] for seen in now if seen not in before]
                log.info("watched files changed: reloading (%s)", ", ".join(changed))
                try:
                    self.on_change()
                except Exception:  # the loop is gone (shutdown): the thread stops next look
                    log.exception("could not start a reload for the watched files")
