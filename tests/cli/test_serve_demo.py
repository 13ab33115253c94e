"""``cascade serve --demo`` as the README's Quickstart runs it: the default policy's rules on
tiny checkpoints. A state longer than Laya reads escalates instead of being cut, unknown model
names are refused, the README's two examples route as the README says, and the start logs no
warning of our own checkpoints' making."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import free_port, wait_http

CASCADE = Path(sys.executable).parent / "cascade"
README = Path(__file__).parents[2] / "README.md"
# The warnings a demo is meant to log: it serves random weights.
DEMO_LABELS = ("DEMO MODE: serving TINY RANDOM checkpoints", "laya: DEMO mode, tiny RANDOM")
ANGER = {
    "anger": {
        "type": "score",
        "instructions": "How angry?",
        "criteria": ["calm", "upset", "furious"],
    }
}


class Demo:
    def __init__(self, url: str, start_log: str) -> None:
        self.url, self.start_log = url, start_log

    def ask(self, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.url + "/v1/systemone", json=body, timeout=60)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """The CLI's demo gateway on loopback (a fresh demo directory), and what it logged until
    it was ready."""
    work = tmp_path_factory.mktemp("serve-demo")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("CASCADE_") or k == "CASCADE_CACHE"
    }
    env["CASCADE_DEMO_DIR"] = str(work / "demo")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [str(CASCADE), "serve", "--demo", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_http(url + "/health", timeout_s=300, proc=proc)
            deadline = time.monotonic() + 120
            while httpx.get(url + "/ready").status_code != 200:
                assert time.monotonic() < deadline, "the demo gateway never became ready"
                time.sleep(0.2)
            log.seek(0)
            yield Demo(url, log.read().decode(errors="replace"))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_no_warnings_at_start_but_the_demo_labels(demo: Demo) -> None:
    """Our own tiny checkpoints load silently (the tiny Laya's temperatures are in Laya's
    range: no ``temperature ... replaced`` lines)."""
    warnings = [line for line in demo.start_log.splitlines() if " WARNING " in line]
    assert warnings, demo.start_log  # the demo labels itself
    assert all(any(label in line for label in DEMO_LABELS) for line in warnings), warnings


def test_a_state_longer_than_laya_reads_escalates(demo: Demo) -> None:
    """The default policy's truncation rule holds in the demo: Clef answers the whole state
    (before: the tiny Laya read 96 tokens and answered with the rest dropped)."""
    state = "The invoice total does not match the purchase order. " * 60  # > 512 Laya tokens
    response = demo.ask({"model": "jev-latest", "state": state, "questions": ANGER})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["x_cascade"]["tiers"] == {"anger": "clef"}
    assert body["x_cascade"]["reasons"] == {"anger": "state_too_long"}
    assert body["usage"]["state_tokens_dropped"] == 0 and not body["usage"]["truncated"]


def test_laya_reads_512_tokens(demo: Demo) -> None:
    """Asked for Laya alone, the same kind of state is cut at Laya's 512-token row."""
    state = "The invoice total does not match the purchase order. " * 60
    response = demo.ask({"model": "laya", "state": state, "questions": ANGER})
    usage = response.json()["usage"]
    assert usage["truncated"] and usage["input_tokens"] == 512, usage


@pytest.mark.parametrize("model", ["gpt-4", "clef", "llama3"])
def test_unknown_model_names_get_400(demo: Demo, model: str) -> None:
    response = demo.ask({"model": model, "state": "hello", "questions": ANGER})
    assert response.status_code == 400, response.text
    assert response.json()["detail"]["error_type"] == "api_usage_error"
    assert f"`{model}`" in response.json()["detail"]["message"]


@pytest.mark.parametrize("model", ["jev-latest", "JEV-1", "cascade", "laya", "clef-flash"])
def test_the_default_policy_model_names_are_served(demo: Demo, model: str) -> None:
    response = demo.ask({"model": model, "state": "hello", "questions": ANGER})
    assert response.status_code == 200, response.text


def quickstart_examples() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(request body, printed response) of each example in README's Quickstart, the bodies
    as the shell would build them (a ``python3 -c`` producer is run)."""
    text = README.read_text()
    section = text[
        text.index("## Quickstart") : text.index("\n## ", text.index("## Quickstart") + 3)
    ]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    examples = []
    for (_, code), (next_lang, printed) in zip(blocks, blocks[1:], strict=False):
        if "curl" not in code or next_lang != "json":
            continue
        code = code.removeprefix("$ ")  # a console block's prompt
        producer = re.match(r"python3 -c '(.*?)' \|", code, re.S)
        if producer:
            out = subprocess.run(
                [sys.executable, "-c", producer.group(1)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            body = json.loads(out)
        else:
            body = json.loads(re.search(r"-d '(.*?)'", code, re.S).group(1))  # type: ignore[union-attr]
        examples.append((body, json.loads(printed)))
    return examples


def test_the_readme_examples_route_as_printed(demo: Demo) -> None:
    """One question stays with Laya, one escalates to Clef, as the README prints them."""
    examples = quickstart_examples()
    assert len(examples) == 2
    tiers = []
    for body, printed in examples:
        response = demo.ask(body)
        assert response.status_code == 200, response.text
        got = response.json()
        for key in ("tiers", "reasons"):
            assert got["x_cascade"][key] == printed["x_cascade"][key]
        assert got["model"] == printed["model"]
        for qid, answer in printed["answers"].items():
            assert got["answers"][qid]["answer_confidence"] == pytest.approx(
                answer["answer_confidence"], abs=1e-3
            )
        tiers += list(got["x_cascade"]["tiers"].values())
    assert tiers == ["laya", "clef"]
