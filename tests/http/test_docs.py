"""/docs renders offline and the document states its auth: Debian's headless Chromium, with
every host name but loopback unresolvable, must show each documented operation; the page loads
nothing from another origin; bearer ``securitySchemes``; every 401 carries ``WWW-Authenticate``."""

from __future__ import annotations

import html
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from litestar import Litestar
from litestar.testing import TestClient

from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from tests.servers import require_tool, serve_app

KEY = {"authorization": "Bearer k1"}
# Swagger UI's markup for one operation; the inline spec in the served page has none of it.
OPERATION = re.compile(
    r'<span class="opblock-summary-method">(\w+)</span>.*?data-path="([^"]+)".*?'
    r'<div class="opblock-summary-description">([^<]*)</div>',
    re.S,
)


def _app(**settings: object) -> Litestar:
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    return create_app(
        Settings(**settings),  # type: ignore[arg-type]
        Gateway(policy, {"upstream": FakeEngine("upstream")}),
    )


def _documented(app: Litestar) -> set[tuple[str, str, str]]:
    paths = app.openapi_schema.to_schema()["paths"]
    return {
        (method.upper(), path, op["summary"])
        for path, item in paths.items()
        for method, op in item.items()
    }


def chromium(url: str, profile: Path, *args: str) -> str:
    """Headless Chromium on ``url`` with no name resolving but 127.0.0.1 (so any CDN fails),
    after 10 s of virtual time; its stdout."""
    cmd = [
        require_tool("chromium"),
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-proxy-server",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
        "--window-size=1280,1600",
        *args,
        url,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def test_docs_page_shows_every_operation_offline(tmp_path: Path) -> None:
    app = _app()
    with serve_app(app) as url:
        dom = chromium(url + "/docs", tmp_path, "--dump-dom")
    shown = {(m, p, html.unescape(s)) for m, p, s in OPERATION.findall(dom)}
    assert ("POST", "/v1/systemone", "Answer typed questions about one state") in shown
    assert shown == _documented(app)


class _Loads(HTMLParser):
    """The URLs a page loads: script ``src``, link ``href``, img ``src``."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = {"script": "src", "link": "href", "img": "src"}.get(tag)
        self.urls += [value for name, value in attrs if name == wanted and value]


def test_docs_page_loads_only_same_origin_assets_behind_the_docs_rule() -> None:
    with serve_app(_app(api_keys=("k1",))) as url:
        page = httpx.get(url + "/docs", headers=KEY)
        assert page.status_code == 200
        loads = _Loads()
        loads.feed(page.text)
        assert len(loads.urls) == 3  # Swagger UI's CSS, bundle and preset
        for asset in loads.urls:
            parts = urlsplit(asset)
            assert not parts.scheme and not parts.netloc, asset
            assert httpx.get(url + asset, headers=KEY).status_code == 200, asset
            assert httpx.get(url + asset).status_code == 401, asset
        assert "fonts.googleapis" not in page.text
    with serve_app(_app(api_keys=("k1",), public_docs=True)) as url:
        assert all(httpx.get(url + asset).status_code == 200 for asset in loads.urls)


def test_openapi_declares_bearer_auth_on_the_authenticated_operations() -> None:
    doc = _app().openapi_schema.to_schema()
    scheme = doc["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    security = {
        (path, method): op.get("security")
        for path, item in doc["paths"].items()
        for method, op in item.items()
    }
    assert security == {
        ("/v1/systemone", "post"): [{"bearer": []}],
        ("/v1/systemone/batch", "post"): [{"bearer": []}],
        ("/v1/decisions", "post"): [{"bearer": []}],
        ("/v1/feedback", "post"): [{"bearer": []}],
        ("/v1/models", "get"): [{"bearer": []}],
        ("/v1/usage", "get"): [{"bearer": []}],
        ("/health", "get"): [{}, {"bearer": []}],  # answers without; details need a key
        ("/ready", "get"): None,
    }
    challenge = doc["paths"]["/v1/models"]["get"]["responses"]["401"]["headers"]
    assert challenge["WWW-Authenticate"]["required"] is True


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/systemone"),
        ("POST", "/v1/systemone/batch"),
        ("GET", "/v1/models"),
        ("POST", "/v1/feedback"),
        ("GET", "/v1/usage"),
        ("GET", "/metrics"),
        ("GET", "/docs"),
        ("GET", "/docs/openapi.json"),
        ("GET", "/docs/assets/swagger-ui-bundle.js"),
    ],
)
@pytest.mark.parametrize("auth", [{}, {"authorization": "Bearer wrong"}])
def test_every_401_carries_a_bearer_challenge(method: str, path: str, auth: dict) -> None:
    with TestClient(_app(api_keys=("k1",))) as client:
        r = client.request(method, path, headers=auth, json={})
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == 'Bearer realm="cascade"'
    assert r.json()["detail"]["error_type"] == "authentication_error"
