"""The HTTP surface with a fake engine: shapes, errors, auth, admission, ids, metrics."""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import json
import time
import zlib
from collections.abc import Iterator

import pytest
import zstandard
from litestar.testing import TestClient
from PIL import Image as PILImage

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from cascade.tenants.files import load_tenants

QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "Payments", "technical": None, "sales": "Deals"},
    },
    "anger": {
        "type": "score",
        "instructions": "How angry?",
        "criteria": ["calm", "upset", "furious"],
    },
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
}
BODY = {"model": "jev-latest", "state": "I was charged twice", "questions": QUESTIONS}


def make_client(handler=deterministic_answer, **settings: object) -> TestClient:
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    gateway = Gateway(
        policy,
        {"upstream": FakeEngine("upstream", handler)},
        profile=settings.pop("profile", "laya"),
    )  # type: ignore[arg-type]
    return TestClient(create_app(Settings(**settings), gateway))  # type: ignore[arg-type]


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client() as c:
        yield c


def test_answers_every_type_with_laya_extras(client: TestClient) -> None:
    r = client.post("/v1/systemone", json=BODY)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body["answers"]) == set(QUESTIONS)
    team = body["answers"]["team"]
    assert team["type"] == "choice"
    assert set(team["probabilities"]) == {"billing", "technical", "sales"}
    assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert abs(sum(team["probabilities"].values()) - 1) < 1e-3
    assert 0 <= team["confidence"] <= 1 and "x_jev_confidence" in team
    anger = body["answers"]["anger"]
    assert anger["legend"] == {"0": "calm", "1": "upset", "2": "furious"}
    expected = sum(int(k) * v for k, v in anger["probabilities"].items())
    assert abs(anger["score"] - expected) < 1e-3
    urgent = body["answers"]["urgent"]
    assert urgent["confidence"] == round(max(urgent["noul"], 1 - urgent["noul"]), 4)
    assert isinstance(body["usage"]["input_tokens"], int)
    assert r.headers["x-request-id"] == r.headers["x-typesafe-request-id"]
    assert body["x_cascade"]["tiers"] == dict.fromkeys(QUESTIONS, "upstream")


def test_jev_profile_is_the_exact_jev_shape() -> None:
    with make_client(profile="jev") as c:
        body = c.post("/v1/systemone", json=BODY).json()
    assert set(body) == {"model", "answers", "usage"}
    assert set(body["usage"]) == {"input_tokens", "output_tokens"}
    assert set(body["answers"]["urgent"]) == {"type", "noul"}
    team = body["answers"]["team"]
    assert set(team) == {"type", "choice", "probabilities", "confidence"}
    p = max(team["probabilities"].values())
    assert team["confidence"] == pytest.approx((3 * p - 1) / 2, abs=2e-4)


def test_request_id_is_echoed(client: TestClient) -> None:
    r = client.post("/v1/systemone", json=BODY, headers={"x-request-id": "abc-123"})
    assert r.headers["x-typesafe-request-id"] == "abc-123"
    assert client.get("/nowhere").headers["x-request-id"]


BAD_BODIES = [  # the hosted Jev API (FastAPI) answers each with 422 json_invalid at POS
    ("truncated JSON", b'{"state": "x", "questions": {"q": {"type": "no', 46),
    ("lone surrogate", b'{"state": "a\\ud800", "questions": {}}', 18),
    ("invalid UTF-8", b'{"state": "\xff", "questions": {}}', 11),
    ("NaN", b'{"state": {"x": NaN}, "questions": {}}', 16),
    ("a multibyte character before the error", '{"é": x}'.encode(), 6),
    ("very deep nesting", b'{"state": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 0),
]


@pytest.mark.parametrize(("name", "raw", "pos"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_malformed_json_is_fastapis_422(
    client: TestClient, name: str, raw: bytes, pos: int
) -> None:
    r = client.post("/v1/systemone", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json() == {
        "detail": [{"loc": ["body", pos], "msg": "JSON decode error", "type": "json_invalid"}]
    }


@pytest.mark.parametrize(
    ("raw", "loc", "kind"), [(b"", ["body"], "missing"), (b"[1, 2]", ["body"], "value_error")]
)
def test_empty_or_non_object_bodies_are_422(
    client: TestClient, raw: bytes, loc: list[str], kind: str
) -> None:
    r = client.post("/v1/systemone", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert (r.json()["detail"][0]["loc"], r.json()["detail"][0]["type"]) == (loc, kind)


def _with(**changes: object) -> dict:
    return {**BODY, **changes}


INVALID = [
    ("missing state", {"model": "jev-latest", "questions": QUESTIONS}, 422, ["body", "state"]),
    ("null state", _with(state=None), 422, ["body", "state"]),
    ("no questions", _with(questions={}), 422, ["body", "questions"]),
    (
        "unknown type",
        _with(questions={"q": {"type": "box", "instructions": "x"}}),
        422,
        ["body", "questions", "q", "type"],
    ),
    (
        "score as a map",
        _with(
            questions={
                "s": {"type": "score", "instructions": "x", "criteria": {"0": "a", "1": "b"}}
            }
        ),
        422,
        ["body", "questions", "s", "criteria"],
    ),
    (
        "null score level",
        _with(questions={"s": {"type": "score", "instructions": "x", "criteria": ["a", None]}}),
        422,
        ["body", "questions", "s", "criteria", 1],
    ),
    (
        "empty choice",
        _with(questions={"c": {"type": "choice", "criteria": {}}}),
        422,
        ["body", "questions", "c", "criteria"],
    ),
    ("huge integer", _with(state={"n": 10**40}), 422, ["body", "state"]),
    ("huge max_len", _with(max_len=10**30), 422, ["body", "max_len"]),
    ("deep state", _with(state=json.loads("[" * 80 + "]" * 80)), 422, ["body", "state"]),
    (
        "colliding labels",
        _with(questions={"c": {"type": "choice", "criteria": [True, "true"]}}),
        422,
        ["body", "questions", "c", "criteria"],
    ),
    (
        "bad option_order",
        _with(questions={"c": {"type": "choice", "criteria": ["a", "b"], "option_order": [0, 0]}}),
        422,
        ["body", "questions", "c", "option_order"],
    ),
    (
        "odd noul key",
        _with(questions={"n": {"type": "noul", "instructions": "x", "criteria": {"maybe": "?"}}}),
        422,
        ["body", "questions", "n", "criteria"],
    ),
    (
        "bad min_confidence",
        _with(min_confidence={"choice:99": 0.5}),
        422,
        ["body", "min_confidence"],
    ),
]


@pytest.mark.parametrize(("name", "body", "status", "loc"), INVALID, ids=[i[0] for i in INVALID])
def test_invalid_requests_get_422_with_loc(
    client: TestClient, name: str, body: dict, status: int, loc: list
) -> None:
    r = client.post("/v1/systemone", json=body)
    assert r.status_code == status, r.text
    assert r.json()["detail"][0]["loc"] == loc


def test_too_many_things_get_413(client: TestClient) -> None:
    options = {f"o{i}": None for i in range(10_000)}
    r = client.post(
        "/v1/systemone", json=_with(questions={"c": {"type": "choice", "criteria": options}})
    )
    assert r.status_code == 413 and "255" in r.json()["detail"]["message"]
    many = {f"q{i}": {"type": "noul", "instructions": "x"} for i in range(65)}
    assert client.post("/v1/systemone", json=_with(questions=many)).status_code == 413


def test_accepts_255_options_and_unicode_names(client: TestClient) -> None:
    options = {f"opción-{i}-ü": None for i in range(255)}
    r = client.post(
        "/v1/systemone", json=_with(questions={"c": {"type": "choice", "criteria": options}})
    )
    assert r.status_code == 200
    assert set(r.json()["answers"]["c"]["probabilities"]) == set(options)


def test_wrong_content_type_is_415(client: TestClient) -> None:
    r = client.post("/v1/systemone", content=b"state=x", headers={"content-type": "text/plain"})
    assert r.status_code == 415


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "zstd"])
def test_compressed_bodies(client: TestClient, encoding: str) -> None:
    raw = json.dumps(BODY).encode()
    data = {
        "gzip": gzip.compress,
        "deflate": zlib.compress,
        "zstd": zstandard.ZstdCompressor().compress,
    }[encoding](raw)
    r = client.post(
        "/v1/systemone",
        content=data,
        headers={"content-type": "application/json", "content-encoding": encoding},
    )
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_zstd_bomb_is_refused_fast(client: TestClient) -> None:
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (1 << 30))
    started = time.perf_counter()
    r = client.post(
        "/v1/systemone",
        content=bomb,
        headers={"content-type": "application/json", "content-encoding": "zstd"},
    )
    assert r.status_code == 413
    assert "16777216" in r.json()["detail"]["message"]
    assert time.perf_counter() - started < 5


def test_body_over_the_limit_is_413() -> None:
    with make_client(max_body_bytes=1000) as c:
        r = c.post("/v1/systemone", json=_with(state="x" * 2000))
    assert r.status_code == 413 and "1000" in r.json()["detail"]["message"]


def _png(color: str = "red") -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), color).save(buf, "PNG")
    return buf.getvalue()


def test_images_reach_the_engine_base64_and_multipart() -> None:
    seen: list[EngineCall] = []

    def handler(call: EngineCall) -> EngineAnswer:
        seen.append(call)
        return deterministic_answer(call)

    with make_client(handler) as c:
        b64 = base64.b64encode(_png()).decode()
        assert c.post("/v1/systemone", json=_with(images=[b64])).status_code == 200
        request = _with(assets={"<img>": {"type": "image", "part": "asset-0"}})
        files = {
            "request": (None, json.dumps(request), "application/json"),
            "asset-0": ("a.png", _png("blue"), "image/png"),
        }
        r = c.post("/v1/systemone", files=files)
        assert r.status_code == 200, r.text
        bad = c.post("/v1/systemone", json=_with(images=["not base64!"]))
        assert bad.status_code == 422
    assert [len(call.images) for call in seen] == [1, 1]
    assert seen[1].images[0].mime == "image/png"


def test_auth_with_keys() -> None:
    with make_client(api_keys=("k1", "k2"), admin_keys=("admin",)) as c:
        assert c.post("/v1/systemone", json=BODY).status_code == 401
        r = c.post("/v1/systemone", json=BODY, headers={"authorization": "Bearer nope"})
        assert r.status_code == 401 and r.json()["detail"]["error_type"] == "authentication_error"
        ok = c.post("/v1/systemone", json=BODY, headers={"authorization": "Bearer k2"})
        assert ok.status_code == 200
        assert c.get("/health").json() == {"status": "ok"}
        client_view = c.get("/health", headers={"authorization": "Bearer k1"}).json()
        assert client_view.keys() == {"status", "loaded", "revisions"}
        assert "tiers" in c.get("/health", headers={"authorization": "Bearer admin"}).json()


def test_auth_off_accepts_any_bearer(client: TestClient) -> None:
    r = client.post("/v1/systemone", json=BODY, headers={"authorization": "Bearer whatever"})
    assert r.status_code == 200
    assert "tiers" in client.get("/health").json()


def test_models_ready_metrics(client: TestClient) -> None:
    names = [m["name"] for m in client.get("/v1/models").json()["models"]]
    assert "jev-latest" in names
    assert client.get("/ready").json() == {"ready": True}
    client.post("/v1/systemone", json=BODY)
    text = client.get("/metrics").text
    assert 'cascade_requests_total{outcome="ok",route="/v1/systemone",status="200"}' in text
    assert client.get("/docs/openapi.json").status_code == 200


def test_batch(client: TestClient) -> None:
    r = client.post(
        "/v1/systemone/batch", json={"states": ["a", {"b": 1}, ["c"]], "questions": QUESTIONS}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["results"]) == 3
    assert r.headers["x-cascade-tiers"] == "upstream=9"  # 3 states x 3 questions
    assert body["total_usage"]["input_tokens"] == sum(
        x["usage"]["input_tokens"] for x in body["results"]
    )
    too_many = {"states": ["a"] * 65, "questions": QUESTIONS}
    assert client.post("/v1/systemone/batch", json=too_many).status_code == 413
    images = {
        "states": ["a"],
        "questions": QUESTIONS,
        "images": [base64.b64encode(_png()).decode()],
    }
    assert client.post("/v1/systemone/batch", json=images).status_code == 422
    files = {
        "request": (
            None,
            json.dumps({"states": ["a"], "questions": QUESTIONS}),
            "application/json",
        ),
        "asset-0": ("a.png", _png(), "image/png"),
    }
    assert client.post("/v1/systemone/batch", files=files).status_code == 422


def test_overload_is_503_with_retry_after() -> None:
    async def slow(call: EngineCall) -> EngineAnswer:
        await asyncio.sleep(0.5)
        return deterministic_answer(call)

    app_client = make_client(slow, max_inflight=1)
    with app_client as c:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            codes = list(pool.map(lambda _: c.post("/v1/systemone", json=BODY), range(4)))
    statuses = sorted(r.status_code for r in codes)
    assert statuses[0] == 200 and 503 in statuses
    busy = next(r for r in codes if r.status_code == 503)
    assert busy.headers["retry-after"] == "1"


def test_openapi_documents_the_wire_schema(client: TestClient) -> None:
    doc = client.get("/docs/openapi.json").json()
    body = doc["paths"]["/v1/systemone"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/SystemOneRequest"}
    schemas = doc["components"]["schemas"]
    assert {
        "SystemOneRequest",
        "SystemOneResponse",
        "BatchRequest",
        "ChoiceQuestion",
        "ValidationErrorBody",
        "ErrorBody",
    } <= set(schemas)
    assert "questions" in schemas["SystemOneRequest"]["properties"]


def test_openapi_documents_health_and_ready_as_objects(client: TestClient) -> None:
    doc = client.get("/docs/openapi.json").json()
    schemas = doc["components"]["schemas"]

    def answer(path: str, status: str) -> dict:
        content = doc["paths"][path]["get"]["responses"][status]["content"]
        ref = content["application/json"]["schema"]["$ref"]
        return schemas[ref.rsplit("/", 1)[1]]

    assert answer("/health", "200")["type"] == "object"
    assert "status" in answer("/health", "200")["properties"]
    for status in ("200", "503"):
        assert answer("/ready", status)["properties"]["ready"] == {"type": "boolean"}


@pytest.mark.parametrize(
    ("settings", "metrics", "docs"),
    [
        ({}, 401, 401),
        ({"public_metrics": True}, 200, 401),
        ({"public_docs": True}, 401, 200),
    ],
)
def test_with_keys_metrics_and_docs_need_one_unless_public(
    settings: dict, metrics: int, docs: int
) -> None:
    with make_client(api_keys=("k1",), admin_keys=("admin",), **settings) as c:
        assert c.get("/metrics").status_code == metrics
        assert c.get("/docs/openapi.json").status_code == docs
        assert c.get("/docs").status_code == docs
        key = {"authorization": "Bearer k1"}
        assert c.get("/metrics", headers=key).status_code == (metrics if metrics == 200 else 403)
        assert c.get("/metrics", headers={"authorization": "Bearer admin"}).status_code == 200
        assert c.get("/docs/openapi.json", headers=key).status_code == 200
        assert c.get("/health").status_code == c.get("/ready").status_code == 200


def test_an_image_the_strong_tier_cannot_take_is_422_at_the_front_door(client: TestClient) -> None:
    buf = io.BytesIO()
    PILImage.new("RGB", (201, 1)).save(buf, "PNG")
    body = {**BODY, "images": [base64.b64encode(buf.getvalue()).decode()]}
    r = client.post("/v1/systemone", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "images", 0]


@pytest.mark.parametrize(
    ("seconds", "header"),
    [
        (float("inf"), "3600"),
        (1e300, "3600"),
        (float("nan"), "1"),
        (-5.0, "1"),
        (0.2, "1"),
        (7.5, "8"),
    ],
)
def test_emitted_retry_after_is_whole_seconds_from_one_to_an_hour(
    seconds: float, header: str
) -> None:
    from cascade.errors import Overloaded
    from cascade.http.app import error_response

    response = error_response(Overloaded("busy", retry_after=seconds))
    assert response.headers["retry-after"] == header


def test_an_api_keys_file_that_is_not_utf8_is_named(tmp_path) -> None:
    path = tmp_path / "keys"
    path.write_bytes("k\xe9y\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{path}: API keys file is not UTF-8 text \(byte 1"):
        load_tenants(Settings(api_keys_file=str(path)))
