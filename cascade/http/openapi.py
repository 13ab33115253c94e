"""OpenAPI for the routes that read their own bodies (compressed, multipart): msgspec's JSON
Schema of the wire Structs, added to the document Litestar builds (``document(app)``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Litestar
from litestar.openapi.spec import (
    OpenAPIMediaType,
    OpenAPIResponse,
    Operation,
    Reference,
    RequestBody,
    Schema,
)

from cascade.schema import (
    BatchRequest,
    BatchResponse,
    ErrorBody,
    Health,
    ModelList,
    Readiness,
    SystemOneRequest,
    SystemOneResponse,
    ValidationErrorBody,
)

REF = "#/components/schemas/{name}"
DOCUMENTED = (SystemOneRequest, SystemOneResponse, BatchRequest, BatchResponse, ModelList,
              Health, Readiness, ErrorBody, ValidationErrorBody)


@dataclass
class JsonSchema(Schema):
    """A schema given as plain JSON Schema (msgspec's output), emitted as is."""

    raw: dict[str, Any] = field(default_factory=dict)

    def to_schema(self) -> dict[str, Any]:
        return self.raw


def document(app: Litestar) -> None:
    """Add the wire Structs to the app's OpenAPI components (Litestar rebuilds its components
    from its own registry, so they are added to the built document, once, at start-up)."""
    _, defs = msgspec.json.schema_components(DOCUMENTED, ref_template=REF)
    openapi = app.openapi_schema
    schemas = openapi.components.schemas = dict(openapi.components.schemas or {})
    schemas.update({name: JsonSchema(raw=schema) for name, schema in defs.items()})


def _json(kind: type) -> dict[str, OpenAPIMediaType]:
    ref = Reference(ref=REF.format(name=kind.__name__))
    return {"application/json": OpenAPIMediaType(schema=ref)}


ROUTE_ERRORS = {
    "422": ("Validation error (malformed JSON included)", ValidationErrorBody),
    "4XX": ("Other client errors (400, 401, 408, 413, 415, 429)", ErrorBody),
    "5XX": ("Overloaded or a needed tier is down (503, see Retry-After), or an upstream "
            "answered garbage (502)", ErrorBody),
}
AUTH_ERRORS = {"401": ("Missing or invalid API key (when keys are configured)", ErrorBody)}


def operation(request: type | None, response: type,
              errors: dict[str, tuple[str, type]] | None = None) -> type[Operation]:
    """An ``operation_class`` documenting a route's JSON body, answer and error shapes:
    ``errors`` (status -> description, Struct), else the /v1 routes' errors."""

    @dataclass
    class Documented(Operation):
        def __post_init__(self) -> None:
            if request is not None:
                self.request_body = RequestBody(
                    content=_json(request), required=True,
                    description="JSON, optionally Content-Encoding zstd/gzip/deflate, or "
                    "multipart/form-data with a `request` JSON part and `asset-N` images",
                )
            shapes = errors if errors is not None else ROUTE_ERRORS
            self.responses = {
                "200": OpenAPIResponse(description="OK", content=_json(response)),
                **{status: OpenAPIResponse(description=text, content=_json(kind))
                   for status, (text, kind) in shapes.items()},
            }

    return Documented
