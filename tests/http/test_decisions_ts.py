"""The official TypeScript SDK (``openai`` 7.55.0 from npm) against the gateway on loopback.

The package is installed once into ``.cache/npm-openai`` (git-ignored; ``CASCADE_NPM_CACHE``
moves it), from the npm registry the first time, from npm's own cache afterwards. Missing
``node`` / ``npm``, or a registry that cannot be reached on the first run, fail the test with
what to do: it is never skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.http.test_decisions import KEY, Tiers, cascade_app
from tests.servers import require_tool, serve_app

SDK = "openai@7.55.0"
SCRIPT = Path(__file__).parent / "ts" / "decisions.mjs"
CACHE = Path(os.environ.get("CASCADE_NPM_CACHE", Path(__file__).parents[2] / ".cache"))


def install_sdk() -> Path:
    """The folder whose ``node_modules`` holds ``SDK`` (installed at most once)."""
    npm = require_tool("npm")
    where = CACHE / "npm-openai"
    if (where / "node_modules" / "openai" / "package.json").exists():
        return where
    where.mkdir(parents=True, exist_ok=True)
    (where / "package.json").write_text('{"private": true, "type": "module"}\n')
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefer-offline", SDK],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"npm install {SDK} failed (is the npm registry reachable? run it "
            f"once with network in {where}):\n{done.stderr[-2000:]}"
        )
    return where


def test_the_typescript_sdk_reads_our_decisions() -> None:
    node = require_tool("node")
    where = install_sdk()
    script = where / SCRIPT.name  # beside its node_modules, so ``import "openai"`` resolves
    script.write_text(SCRIPT.read_text())
    with serve_app(cascade_app(Tiers(), api_keys=(KEY,))) as url:
        done = subprocess.run(
            [node, str(script), url + "/v1", KEY], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    urgent, refund, anger = out["decision"]["answers"]
    assert (urgent["type"], urgent["name"]) == ("predicate", "urgent")
    assert refund["name"] is None
    assert [p["value"] for p in refund["probabilities"]] == [True, "true"]
    assert [p["label"] for p in anger["probabilities"]] == ["calm", "furious"]
    assert out["decision"]["usage"]["total_tokens"] == out["decision"]["usage"]["input_tokens"]
    assert out["error"] == {
        "class": "NotFoundError",
        "status": 404,
        "param": "model",
        "code": "model_not_found",
    }
