"""A ConfigMap volume as the kubelet writes it (``AtomicWriter``): the files live in a
``..2026_...`` directory, ``..data`` is a symlink to it, each file is a symlink to
``..data/FILE``; an update writes a new directory, renames a fresh symlink over ``..data`` (one
atomic step) and removes the old directory."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

_serial = itertools.count()


class ConfigMap:
    def __init__(self, root: Path, files: dict[str, str]) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.update(files)

    def path(self, name: str) -> Path:
        return self.root / name

    def update(self, files: dict[str, str]) -> None:
        """Every file's new text, swapped in at once as the kubelet does."""
        version = self.root / f"..2026_12_05_12_00_{next(_serial):02d}.{os.getpid()}"
        version.mkdir()
        for name, text in files.items():
            (version / name).write_text(text)
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version.name)
        os.rename(tmp, data)  # the one atomic step
        for name in files:
            if not self.path(name).is_symlink():
                self.path(name).symlink_to(Path("..data") / name)
        if old is not None:
            for child in (self.root / old).iterdir():
                child.unlink()
            (self.root / old).rmdir()
