"""``OTEL_*`` turns tracing on; nothing else does, and a plain install names the extra."""

from __future__ import annotations

import pytest

from cascade.errors import missing_extra
from cascade.settings import otel_environ
from cascade.tracing import active
from cascade.tracing.config import from_env, wanted


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_only_an_exporter_turns_tracing_on(environ: dict[str, str], on: bool) -> None:
    assert wanted(environ) is on
    built = from_env(environ)
    assert (built is not None) is on
    if built is not None:
        built.shutdown()


def test_an_unknown_exporter_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER='zipkin'"):
        from_env({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_off_is_the_default_and_costs_no_import() -> None:
    assert active.current() is None and active.middleware() == []
    assert active.trace_id() == "" and active.exemplar() is None
    headers = [("x-request-id", "a")]
    assert active.injected(headers) is headers
    with active.span("cascade.decide") as span:
        assert span is None


def test_otel_variables_are_read_through_settings() -> None:
    assert otel_environ({"OTEL_SERVICE_NAME": "a", "CASCADE_PORT": "1"}) == {
        "OTEL_SERVICE_NAME": "a"
    }


def test_a_missing_sdk_names_the_tracing_extra() -> None:
    hint = missing_extra(
        ModuleNotFoundError("No module named 'opentelemetry'", name="opentelemetry.sdk")
    )
    assert hint is not None and "cascade-router[tracing]" in hint
