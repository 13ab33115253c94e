"""Whether a running server serves random weights, as the benchmarks that drive one ask it: its
``/health`` ``demo`` flag (every detail with an admin key, or with no key configured), else the
DEMO prefix of its ``/v1/models`` cards (what a client key sees)."""

from __future__ import annotations

import httpx

DEMO_CARD = "DEMO"


def served_demo(url: str, *, key: str | None = None, admin_key: str | None = None) -> bool:
    """True when ``url`` says it serves random weights; False when it says not or cannot say
    (a server that is no cascade)."""
    with httpx.Client(base_url=url, timeout=10) as client:
        for path, secret in (("/health", admin_key or key), ("/v1/models", key or admin_key)):
            headers = {"authorization": f"Bearer {secret}"} if secret else {}
            try:
                found = client.get(path, headers=headers).json()
            except (httpx.HTTPError, ValueError):
                continue
            if isinstance(found, dict) and (
                found.get("demo") is True
                or any(
                    str(card.get("description", "")).startswith(DEMO_CARD)
                    for card in found.get("models") or []
                    if isinstance(card, dict)
                )
            ):
                return True
    return False
