"""The fault suite's stack: the tiny Laya in process, the strong tier a stub upstream (or the
demo's tiny tiers), all on loopback. Short timeouts and cooldowns keep each case to seconds."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from cascade.http.app import create_app
from cascade.laya.tiny import make_tiny
from cascade.settings import Settings
from tests.faults.stub import Stub
from tests.servers import scrape, serve_app

POLICY = """
[tiers.laya]
kind = "laya"
checkpoints = {checkpoints}
timeout_s = 5.0
{laya_extra}

[tiers.clef]
kind = "upstream"
urls = ["{upstream}"]
connect_timeout_s = 0.3
read_timeout_s = {read_timeout_s}
timeout_s = {timeout_s}
health_interval_s = 0.2
{upstream_extra}

{models}

[route]
cheap = "laya"
strong = "clef"
{route_extra}

[thresholds.confidence]
noul = {{ "2" = 0.999 }}  # every noul escalates; choices stay with Laya

[breaker.clef]
window_s = 30.0
min_calls = 3
failure_ratio = 0.5
cooldown_s = {cooldown_s}
"""
COOLDOWN_S = 1.0
ESCALATES = {
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "team": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "payments", "tech": "bugs", "sales": "deals"},
    },
}
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5E"
    "rkJggg=="
)
Gateway = Callable[..., contextlib.AbstractContextManager[str]]


@pytest.fixture(scope="session")
def tiny_laya(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("faults-laya") / "laya")


@pytest.fixture
def stub() -> Iterator[Stub]:
    upstream = Stub()
    upstream.start()
    yield upstream
    upstream.stop()


@pytest.fixture
def gateway(tiny_laya: Path, tmp_path: Path) -> Gateway:
    """``gateway(upstream_url, route_extra=..., ...)``: a gateway on loopback (a context)."""

    @contextlib.contextmanager
    def start(upstream: str, *, settings: Settings | None = None, **extra: str) -> Iterator[str]:
        fields = {
            "checkpoints": f'{{ english = "{tiny_laya}" }}',
            "upstream": upstream,
            "cooldown_s": COOLDOWN_S,
            "models": '[models]\nunknown = "cascade"',
            "laya_extra": "",
            "upstream_extra": "",
            "route_extra": "",
            "read_timeout_s": 0.6,
            "timeout_s": 0.8,
            **extra,
        }
        policy = tmp_path / "policy.toml"
        policy.write_text(POLICY.format(**fields))
        base = settings or Settings()
        app = create_app(Settings(**{**_fields(base), "policy": str(policy)}))
        with serve_app(app, timeout_s=120) as url:
            yield url

    return start


def _fields(settings: Settings) -> dict:
    import msgspec

    return msgspec.structs.asdict(settings)


def ask(
    url: str,
    questions: dict | None = None,
    *,
    state: str = "my refund is late",
    timeout: float = 30,
    **body: object,
) -> httpx.Response:
    payload = {"model": "jev-latest", "state": state, "questions": questions or ESCALATES, **body}
    return httpx.post(url + "/v1/systemone", json=payload, timeout=timeout)


def metric(url: str, name: str, **labels: str) -> float:
    return scrape(url).get((name, frozenset(labels.items())), 0.0)


def breaker(url: str) -> float:
    return metric(url, "cascade_breaker_state", tier="clef")
