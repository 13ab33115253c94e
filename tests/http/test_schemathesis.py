"""schemathesis against the served OpenAPI document: generated requests for every operation
(a bounded number each), against the gateway on loopback with a fake engine. No response may be
a 5xx, and every response must match the documented status codes, content types, headers and
schemas. Not checked: that every schema-valid body is accepted, since rules JSON Schema cannot
state (an asset's ``part`` must name a multipart part, at least one question) are 422s."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from litestar import Litestar
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from cascade.store.sqlite import SqliteStore
from tests.servers import serve_app

MAX_EXAMPLES = 40
KEY = "schemathesis-key"


def _app(log: SqliteStore | None = None) -> Litestar:
    """With an API key, so the documented bearer security is enforced (schemathesis also
    checks that the authenticated operations refuse requests without the key); served with a
    decision log, so that feedback reaches its lookup."""
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    return create_app(
        Settings(api_keys=(KEY,)),
        Gateway(policy, {"upstream": FakeEngine("upstream")}, decisions=log),
    )


# The document the app serves at /docs/openapi.json, read at collection time (schemathesis'
# lazy fixture loader does not run under pytest 9).
schema = schemathesis.openapi.from_dict(_app().openapi_schema.to_schema())
# Valid bodies and invalid ones (wrong types, missing fields, bad content types) alike.
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
schema.config.update(headers={"Authorization": f"Bearer {KEY}"})


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path: Path = tmp_path_factory.mktemp("log") / "decisions.db"
    log = SqliteStore(path)
    try:
        with serve_app(_app(log)) as url:
            yield url
    finally:
        log.close()


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_the_api_matches_its_openapi_document(case: schemathesis.Case, base_url: str) -> None:
    case.call_and_validate(
        base_url=base_url, timeout=30, excluded_checks=[positive_data_acceptance]
    )
