"""Every use of a library's private internals, one module per library, each checked at import.

A private name (uvicorn's ``_captured_signals``, h11's ``_receive_buffer``, the words of an
error message) can change in any release. Each module here says which versions it was written
for (the lock's, ``deploy/lock/serve.txt``) and ``require`` refuses to import it under any other,
so an upgrade fails at start-up with the module to re-read, not later on a request; each
override has a test against the installed library (``tests/overrides/``).

=================  ==================================================  ===========================
library            private name                                        used for
=================  ==================================================  ===========================
uvicorn            ``Server._captured_signals``                        a drained SIGTERM exits 0
uvicorn            ``H11Protocol._unsupported_upgrade_warning``        no log line per h2c upgrade
uvicorn            ``RequestResponseCycle.transport``                  a head and body in one write
h11                ``Connection._receive_buffer``                      the size of a request head
h11                the message ``Receive buffer too long``             431 with our reason
prometheus_client  ``prometheus_client.metrics.MetricWrapperBase``     children looked up once
msgspec            ``ValidationError``/``DecodeError`` message format  error paths and positions
=================  ==================================================  ===========================
"""

from __future__ import annotations

import importlib.metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version


class UnsupportedVersion(ImportError):
    """An installed library outside the versions an override module was written for."""


def require(distribution: str, versions: str, module: str) -> None:
    """Raise ``UnsupportedVersion`` unless ``distribution``'s installed version is in
    ``versions`` (a PEP 440 specifier such as ``>=0.54,<0.55``); ``module`` names the override
    module to re-read before widening the range."""
    installed = importlib.metadata.version(distribution)
    if Version(installed) not in SpecifierSet(versions):
        raise UnsupportedVersion(
            f"{module} uses private internals of {distribution} {versions}, and "
            f"{distribution} {installed} is installed: check each override in {module} against "
            f"{distribution} {installed} (tests/overrides/), then widen the range, or install "
            f"the locked version (deploy/lock/serve.txt)"
        )
