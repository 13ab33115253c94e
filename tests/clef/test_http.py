"""The gateway app with one in-process Clef tier answers what the reference answers."""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from cascade.engines.clef import ClefEngine
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import ClefTier, Policy
from cascade.settings import Settings
from tests.clef.clef_cases import CASES, request


def test_systemone_over_http_matches_reference(reference, tiny_release):
    jsm, model, processor = reference
    tier = ClefTier(release=str(tiny_release), device="cpu", timeout_s=60.0)
    engine = ClefEngine("clef", tiny_release, device="cpu")
    gateway = Gateway(Policy.single_tier("clef", tier), {"clef": engine}, profile="jev")
    with TestClient(create_app(Settings(), gateway)) as client:
        bodies = [request(CASES[name]) for name in ("object-state", "no-descriptions")]
        responses = [client.post("/v1/systemone", json=body) for body in bodies]
        assert client.get("/ready").status_code == 200
    for body, response in zip(bodies, responses, strict=True):
        assert response.status_code == 200, response.text
        got, want = response.json(), jsm.systemone(model, processor, body)
        assert got["usage"]["input_tokens"] == want["usage"]["input_tokens"]
        for qid, expected in want["answers"].items():
            answer = got["answers"][qid]
            assert answer["type"] == expected["type"]
            if expected["type"] == "noul":
                assert answer["noul"] == pytest.approx(expected["noul"], abs=1e-4)
                continue
            assert answer["probabilities"] == pytest.approx(expected["probabilities"], abs=1e-4)
            assert list(answer["probabilities"]) == list(expected["probabilities"])
            if expected["type"] == "choice":
                assert answer["choice"] == expected["choice"]
            else:
                assert answer["score"] == pytest.approx(expected["score"], abs=1e-3)
