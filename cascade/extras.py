"""The optional packages of ``cascade-router``: which extra brings each, and the install hint.

The plain install (no extras) serves ``--upstream`` and pre-exported Laya ONNX; everything that
needs torch, transformers, onnx or matplotlib imports it where it runs. A missing one is
reported by the command line in one line naming the extra (``missing``), never a traceback.
"""

from __future__ import annotations

DISTRIBUTION = "cascade-router"
# Top-level import name -> the extras that bring it (the first is the one to suggest).
EXTRAS: dict[str, tuple[str, ...]] = {
    "torch": ("export", "gpu"),
    "transformers": ("export", "gpu"),
    "onnx": ("export",),
    "onnxscript": ("export",),
    "accelerate": ("gpu",),
    "matplotlib": ("eval",),
    "tqdm": ("eval",),
}


def install_hint(*extras: str) -> str:
    """``pip install 'cascade-router[export,eval]'``."""
    return f"pip install '{DISTRIBUTION}[{','.join(extras)}]'"


def missing(exc: ModuleNotFoundError) -> str | None:
    """The one-line message for an optional package that is not installed (None: ``exc`` is
    about another module, a bug to show with its traceback)."""
    package = (exc.name or "").partition(".")[0]
    extras = EXTRAS.get(package)
    if extras is None:
        return None
    hints = " or ".join(install_hint(extra) for extra in extras)
    return f"{package} is not installed (the {' or '.join(extras)} extra): {hints}"
