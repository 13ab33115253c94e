"""The cheap tier saturated, and what Laya clients send: the strong tier takes what the cheap
tier cannot queue; model names are read the way laya-serve reads them."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx

from tests.faults.conftest import Gateway, ask
from tests.faults.stub import Stub

MANY = {
    f"team{i}": {
        "type": "choice",
        "instructions": f"Which team, take {i}?",
        "criteria": {"billing": "payments", "tech": "bugs", "sales": "deals"},
    }
    for i in range(6)
}  # choices stay with Laya in this policy


def test_a_saturated_cheap_queue_hands_work_to_the_strong_tier(
    stub: Stub, gateway: Gateway
) -> None:
    async def burst(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            body = {"model": "jev-latest", "questions": MANY}
            return await asyncio.gather(
                *(
                    client.post("/v1/systemone", json={**body, "state": f"ticket {i}"})
                    for i in range(24)
                )
            )

    # other requests' rows: 1. The stub answers every hand-off: give it the time a loaded
    # machine needs (the suite's 0.8 s whole-call limit is for the tests of slow tiers).
    with gateway(
        stub.url, laya_extra="max_queue = 1", read_timeout_s="10.0", timeout_s="10.0"
    ) as url:
        responses = [r for _ in range(3) for r in asyncio.run(burst(url))]
    assert {r.status_code for r in responses} == {200}
    reasons = [set(r.json()["x_cascade"]["reasons"].values()) for r in responses]
    assert {"cheap_failed"} in reasons  # some found the queue full and went strong ...
    assert set() in reasons  # ... the others were answered by Laya


def test_laya_clients_model_names_under_the_default_policy(
    stub: Stub, gateway: Gateway, tiny_laya: Path
) -> None:
    text = (Path(__file__).parents[2] / "policies" / "default.toml").read_text()
    models = re.search(r"^\[models\]\n.*?(?=^\[)", text, re.S | re.M)
    assert models is not None
    both = f'{{ english = "{tiny_laya}", multilingual = "{tiny_laya}" }}'
    with gateway(stub.url, models=models.group(0), checkpoints=both) as url:

        def model_of(name: str) -> str:
            response = ask(url, {"u": {"type": "noul", "instructions": "Urgent?"}}, model=name)
            assert response.status_code == 200, (name, response.text)
            # make-tiny weights are labelled as --demo labels them (issue 29): the checkpoint
            # name is inside the label
            labelled = str(response.json()["model"])
            assert labelled.startswith("DEMO-random-weights/"), labelled
            return labelled.removeprefix("DEMO-random-weights/").removesuffix("-demo-random")

        assert model_of("convaiinnovations/laya-multilingual") == "multilingual"
        assert model_of("ConvaiInnovations/Laya-Multilingual") == "multilingual"
        assert model_of("English") == "english"
        assert model_of("convaiinnovations/laya") == "english"  # the tier's own choice
        assert model_of("LAYA") == "english"
        for name in ("jev-1", "JEV-LATEST", "jev-1.13.0"):
            model_of(name)  # the cascade
        unknown = ask(url, model="gpt-4")
        assert unknown.status_code == 400 and "api_usage_error" in unknown.text
