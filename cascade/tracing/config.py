"""Whether ``OTEL_*`` asks for traces, and the ``OtelTracing`` it describes.

Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is
set, or ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp`` or ``console``; another is
refused); ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turns it off. The SDK
reads the rest itself: ``OTEL_SERVICE_NAME`` (default ``cascade``), ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_PROPAGATORS``, ``OTEL_BSP_*`` (the batch processor's
bounded queue: a slow or unreachable collector drops spans, never delays a response) and
``OTEL_EXPORTER_OTLP_*`` (OTLP/HTTP protobuf).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler

    from cascade.tracing.otel import OtelTracing

_SWITCHES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
EXPORTERS = ("otlp", "console")


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` configures traces (see the module docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter) or any(environ.get(name) for name in _SWITCHES)


def from_env(environ: Mapping[str, str]) -> OtelTracing | None:
    """The tracing ``environ`` configures, or None. Without the ``tracing`` extra installed,
    ``ModuleNotFoundError`` for ``opentelemetry`` (the CLI names the extra:
    ``cascade.errors.missing_extra``)."""
    if not wanted(environ):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    exporter = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter not in EXPORTERS:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={exporter!r}: cascade exports otlp "
            "(OTLP/HTTP protobuf) or console"
        )
    chosen = ConsoleSpanExporter() if exporter == "console" else OTLPSpanExporter()
    return build(chosen, service_name="" if environ.get("OTEL_SERVICE_NAME") else "cascade")


def build(
    exporter: SpanExporter, *, sampler: Sampler | None = None, service_name: str = "cascade"
) -> OtelTracing:
    """Tracing that exports to ``exporter`` through a batch processor; ``sampler`` None: the
    SDK's, from ``OTEL_TRACES_SAMPLER`` (default: parent-based, always on). ``service_name``
    "": ``OTEL_SERVICE_NAME``'s."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from cascade import __version__
    from cascade.tracing.otel import OtelTracing

    named = {"service.name": service_name} if service_name else {}
    provider = TracerProvider(
        sampler=sampler, resource=Resource.create({**named, "service.version": __version__})
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return OtelTracing(provider)
