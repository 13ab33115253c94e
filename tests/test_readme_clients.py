"""The README's client snippet (its one ``python`` block) runs as printed against a gateway on
loopback serving ``policies/default.toml``'s model table (fake tiers): the System One SDK, the
OpenAI SDK and Laya's remote client each get an answer by base URL alone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.files import load_policy
from cascade.settings import Settings
from tests.servers import serve_app

REPO = Path(__file__).parents[1]


def test_the_readme_client_snippet_runs() -> None:
    (snippet,) = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    policy = load_policy(REPO / "policies" / "default.toml")
    engines = {name: FakeEngine(name, deterministic_answer) for name in policy.tiers}
    with serve_app(create_app(Settings(), Gateway(policy, engines))) as url:
        assert "http://127.0.0.1:8000" in snippet
        scope: dict[str, Any] = {}
        exec(snippet.replace("http://127.0.0.1:8000", url), scope)  # noqa: S102
        assert scope["answer"].answers["anger"].legend[2] == "furious"
        assert [a.type for a in scope["decision"].answers] == ["score"]
        assert scope["router"].health()["status"] == "ok"
