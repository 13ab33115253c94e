"""Real gateway processes for the fleet tests: ``cascade serve --demo`` replicas on one policy,
and uneven traffic, measured from the answers (which tier answered each question)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from cascade.build import DEFAULT_POLICY
from tests.servers import free_port

YES_NO = {"type": "choice", "criteria": ["yes", "no"]}
WIDE = {"type": "choice", "criteria": [f"o{i}" for i in range(60)]}  # pre-routed strong


def policy_file(path: Path, control: str) -> Path:
    """The default policy with ``control``'s lines in its ``[control]`` table."""
    path.write_text(
        DEFAULT_POLICY.read_text(encoding="utf-8") + "\n[control]\n" + control, encoding="utf-8"
    )
    return path


@contextlib.contextmanager
def replicas(
    policy: Path,
    n: int,
    *,
    timeout_s: float = 300.0,
    env: dict[str, str] | None = None,
    own: Callable[[int], dict[str, str]] = lambda i: {},
) -> Iterator[list[Replica]]:
    """``n`` demo replicas of ``policy`` on loopback, started at once (``--demo`` writes its
    tiny checkpoints beside their directory and renames them in, so none reads another's
    half-written file), ``own(i)`` added to replica ``i``'s ``env``; always stopped."""
    with contextlib.ExitStack() as stack:
        started = [
            stack.enter_context(replica(policy, {**(env or {}), **own(i)})) for i in range(n)
        ]
        for one in started:
            one.wait_ready(timeout_s)
        yield started


@dataclass
class Replica:
    url: str
    proc: subprocess.Popen[bytes]

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica exited with {self.proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"{self.url} not ready within {timeout_s} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def replica(policy: Path, env: dict[str, str] | None = None) -> Iterator[Replica]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "cascade",
        "serve",
        "--demo",
        "--policy",
        str(policy),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    found = Replica(
        f"http://127.0.0.1:{port}", subprocess.Popen(cmd, env={**os.environ, **(env or {})})
    )
    try:
        yield found
    finally:
        found.stop()


@dataclass(frozen=True)
class Answered:
    at: float  # monotonic seconds
    replica: int
    strong: bool
    reason: str  # why it went where it did ("" kept cheap with confidence)


async def drive(
    urls: Sequence[str],
    *,
    seconds: float,
    weights: Sequence[float],
    wide: Sequence[float],
    clients: int = 6,
    seed: int = 0,
) -> list[Answered]:
    """One-question requests for ``seconds``: each to replica ``i`` with probability
    ``weights[i]``, a 60-option question (pre-routed strong) with probability ``wide[i]``,
    else a yes/no one the gate decides; which tier answered each (refusals left out)."""
    import random

    rng = random.Random(seed)
    out: list[Answered] = []
    end = time.monotonic() + seconds

    async def client(http: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            i = rng.choices(range(len(urls)), weights)[0]
            question = WIDE if rng.random() < wide[i] else YES_NO
            body = {
                "model": "jev-latest",
                "state": f"item {rng.random()}",
                "questions": {"q": question},
            }
            r = await http.post(urls[i] + "/v1/systemone", json=body)
            if r.status_code != 200:  # shed under load (429, 503, 408): not an answer
                continue
            cascade = r.json()["x_cascade"]
            out.append(
                Answered(
                    time.monotonic(),
                    i,
                    cascade["tiers"]["q"] == "clef",
                    cascade["reasons"].get("q", ""),
                )
            )

    async with httpx.AsyncClient(timeout=30) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return out


def share(answers: Sequence[Answered], since: float) -> float:
    late = [a for a in answers if a.at >= since]
    return sum(a.strong for a in late) / len(late)
