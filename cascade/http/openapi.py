"""OpenAPI for the routes that read their own bodies (compressed, multipart): msgspec's JSON
Schema of the wire Structs, added to the document Litestar builds (``document(app)``); bearer
auth as a security scheme; and ``/docs`` (``docs_config``), a Swagger UI page served wholly from
this process: its JS and CSS come from the pinned ``litestar-offline-docs`` wheel, no CDN, no
web fonts, so it renders without internet."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import litestar_offline_docs
import msgspec
from litestar import Litestar, Router
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin, YamlRenderPlugin
from litestar.openapi.spec import (
    Components,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Reference,
    RequestBody,
    Schema,
    SecurityRequirement,
    SecurityScheme,
)
from litestar.static_files import create_static_files_router
from litestar.types import Guard

from cascade import __version__
from cascade.contracts.openai_schema import Decision, DecisionCreate, Message, OpenAIError, ToolItem
from cascade.schema import (
    BatchRequest,
    BatchResponse,
    ErrorBody,
    FeedbackRequest,
    FeedbackResponse,
    Health,
    ModelList,
    Readiness,
    SystemOneRequest,
    SystemOneResponse,
    ValidationErrorBody,
)

REF = "#/components/schemas/{name}"
BEARER = "bearer"
# The ``security`` of the operations that need a key when keys are configured, and of /health,
# which answers without one (a client key adds the loaded checkpoints, an admin key the rest).
AUTHENTICATED: list[SecurityRequirement] = [{BEARER: []}]
KEY_OPTIONAL: list[SecurityRequirement] = [{}, {BEARER: []}]
SECURITY_SCHEMES: dict[str, SecurityScheme | Reference] = {
    BEARER: SecurityScheme(
        type="http",
        scheme="bearer",
        description="An API key from CASCADE_API_KEYS / CASCADE_API_KEYS_FILE, sent as "
        "`Authorization: Bearer <key>`; with no keys configured, auth is off.",
    )
}
DOCS = "/docs"
ASSETS = "/assets"  # under DOCS
ASSET_DIR = Path(litestar_offline_docs.__file__).parent / "static"  # Swagger UI 5.1.3
DOCUMENTED = (
    SystemOneRequest,
    SystemOneResponse,
    BatchRequest,
    BatchResponse,
    ModelList,
    Health,
    Readiness,
    ErrorBody,
    ValidationErrorBody,
    DecisionCreate,
    Decision,
    OpenAIError,
    FeedbackRequest,
    FeedbackResponse,
)


@dataclass
class JsonSchema(Schema):
    """A schema given as plain JSON Schema (msgspec's output), emitted as is."""

    raw: dict[str, Any] = field(default_factory=dict)

    def to_schema(self) -> dict[str, Any]:
        return self.raw


def document(app: Litestar) -> None:
    """Add the wire Structs to the app's OpenAPI components (Litestar rebuilds its components
    from its own registry, so they are added to the built document, once, at start-up)."""
    (*_, messages, tools), defs = msgspec.json.schema_components(
        (*DOCUMENTED, Message, ToolItem), ref_template=REF
    )
    # ``input`` items are messages (tagged by role) or tool items (by type): one union msgspec
    # cannot state, decoded one item at a time.
    text, items = defs[DecisionCreate.__name__]["properties"]["input"]["anyOf"]
    items["items"] = {"anyOf": [messages, tools]}
    openapi = app.openapi_schema
    schemas = openapi.components.schemas = dict(openapi.components.schemas or {})
    schemas.update({name: JsonSchema(raw=schema) for name, schema in defs.items()})


def _json(kind: type) -> dict[str, OpenAPIMediaType]:
    ref = Reference(ref=REF.format(name=kind.__name__))
    return {"application/json": OpenAPIMediaType(schema=ref)}


AUTH_ERRORS = {"401": ("Missing or invalid API key (when keys are configured)", ErrorBody)}
ROUTE_ERRORS = {
    "422": ("Validation error (malformed JSON included)", ValidationErrorBody),
    **AUTH_ERRORS,
    "4XX": ("Other client errors (400, 408, 413, 415, 429)", ErrorBody),
    "5XX": (
        "Overloaded or a needed tier is down (503, see Retry-After), or an upstream "
        "answered garbage (502)",
        ErrorBody,
    ),
}
DECISION_ERRORS = {
    "400": ("Not JSON, too large, or an unsupported content type", OpenAIError),
    "401": ("Missing or invalid API key (when keys are configured)", OpenAIError),
    "404": ("Unknown model (`model_not_found`)", OpenAIError),
    "422": ("Validation error; `param` names the field", OpenAIError),
    "4XX": ("Other client errors (408, 429)", OpenAIError),
    "5XX": (
        "Overloaded or every question needs a tier that is down (503, see Retry-After), "
        "or an upstream answered garbage (502)",
        OpenAIError,
    ),
}
CHALLENGE: dict[str, OpenAPIHeader | Reference] = {
    "WWW-Authenticate": OpenAPIHeader(
        schema=Schema(type=OpenAPIType.STRING),
        required=True,
        description='`Bearer realm="cascade"` (RFC 6750)',
    )
}


def operation(
    request: type | None,
    response: type,
    errors: Mapping[str, tuple[str, type]] | None = None,
    *,
    body: str = "JSON, optionally Content-Encoding zstd/gzip/deflate, or "
    "multipart/form-data with a `request` JSON part and `asset-N` images",
) -> type[Operation]:
    """An ``operation_class`` documenting a route's JSON body, answer and error shapes:
    ``errors`` (status -> description, Struct), else the /v1 routes' errors."""

    @dataclass
    class Documented(Operation):
        def __post_init__(self) -> None:
            if request is not None:
                self.request_body = RequestBody(
                    content=_json(request), required=True, description=body
                )
            shapes = errors if errors is not None else ROUTE_ERRORS
            self.responses = {
                "200": OpenAPIResponse(description="OK", content=_json(response)),
                **{
                    status: OpenAPIResponse(
                        description=text,
                        content=_json(kind),
                        headers=CHALLENGE if status == "401" else None,
                    )
                    for status, (text, kind) in shapes.items()
                },
            }

    return Documented


def docs_config(guard: Guard) -> OpenAPIConfig:
    """``/docs``: Swagger UI, ``/docs/openapi.json`` and ``.yaml``, and the UI's JS and CSS at
    ``/docs/assets/``, every one behind ``guard`` (the page is useless without its assets and
    they are not secret, but one rule for the whole prefix is simpler to reason about)."""
    assets = create_static_files_router(ASSETS, directories=[ASSET_DIR], name="docs-assets")
    swagger = SwaggerRenderPlugin(
        path="/",
        js_url=f"{DOCS}{ASSETS}/swagger-ui-bundle.js",
        css_url=f"{DOCS}{ASSETS}/swagger-ui.css",
        standalone_preset_js_url=f"{DOCS}{ASSETS}/swagger-ui-standalone-preset.js",
        favicon="",  # Litestar's default is an icon on a CDN
    )
    return OpenAPIConfig(
        title="cascade",
        version=__version__,
        components=Components(security_schemes=SECURITY_SCHEMES),
        render_plugins=[swagger, YamlRenderPlugin()],
        openapi_router=Router(
            DOCS, route_handlers=[assets], guards=[guard], include_in_schema=False
        ),
    )
