"""cascade.overrides.require: an override module refuses versions it was not written for."""

from __future__ import annotations

import importlib.metadata

import pytest

from cascade.overrides import UnsupportedVersion, require


def test_the_installed_version_passes_and_another_range_is_refused_by_name() -> None:
    installed = importlib.metadata.version("h11")
    require("h11", f"=={installed}", "cascade.overrides.h11")
    with pytest.raises(UnsupportedVersion) as caught:
        require("h11", "<0.1", "cascade.overrides.h11")
    message = str(caught.value)
    assert f"h11 {installed} is installed" in message and "cascade.overrides.h11" in message


def test_every_override_module_imports_under_the_locked_versions() -> None:
    import cascade.overrides.h11
    import cascade.overrides.msgspec
    import cascade.overrides.prometheus_client
    import cascade.overrides.uvicorn  # noqa: F401
