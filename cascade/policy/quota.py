"""A tenant's strong-tier quota for one request (``strong_questions_per_min``), sans IO.

``cascade.tenants.admission`` reserves, once the body is decoded, the strong answers the request
may have: as many as it has questions, at most what its tenant has left and no other request of
that tenant in flight here has reserved. The flow (``cascade.policy.flow.decide``) takes from
it before the strong call; a batch's states share one. The tenant is charged afterwards for the
strong answers it got, and the reservation is released.
"""

from __future__ import annotations

import math

from cascade.errors import TenantLimited


class StrongQuota:
    def __init__(self, tenant: str, per_min: int, left: int, retry_after_s: float) -> None:
        self.tenant, self.per_min = tenant, per_min
        self.left = left  # strong answers this request may still have
        self.retry_after_s = retry_after_s  # until the tenant has one more
        self.refused: TenantLimited | None = None  # the 429, once made

    def take(self, wanted: int) -> int:
        """Up to ``wanted`` strong answers: how many were granted."""
        granted = min(wanted, self.left)
        self.left -= granted
        return granted

    def give(self, granted: int) -> None:
        """Give back answers taken and not used."""
        self.left += granted

    def refusal(self) -> TenantLimited:
        """429 for a question only the strong tier may answer, over the quota."""
        self.refused = TenantLimited(
            f"tenant `{self.tenant}` is over its strong_questions_per_min ({self.per_min}); "
            f"retry in {math.ceil(self.retry_after_s)} s",
            retry_after=self.retry_after_s,
        )
        return self.refused
