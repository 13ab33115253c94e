"""Rewriting a keys file in place (``cascade keys``): an advisory lock (``flock`` on
``.FILE.lock`` beside it, a file that outlives every edit) is held from the read to the write,
so concurrent runs apply one after another on the latest text and none drops another's key.
The new text replaces the file at once (a reader, a gateway's reload included, sees the old
file or the new one), keeping its mode; a new file is 0600 (it lists who may call the
gateway)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from cascade.tenants.files import read_text


def edit(path: Path, change: Callable[[str], str]) -> None:
    """Replace ``path``'s text (``""`` when there is no file yet) with ``change(text)``, under
    the lock; an exception from ``change`` leaves the file as it was."""
    with _locked(path):
        text = read_text(str(path)) if path.exists() else ""
        _replace(path, change(text))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes, or the process ends
        yield
    finally:
        os.close(fd)


def _replace(path: Path, text: str) -> None:
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
