"""Who is in the fleet: each replica's heartbeat is a Redis key that expires after ``seen_s``, so
the keys alive are the replicas seen within it. A heartbeat's age is read from its remaining TTL
(Redis's clock: replicas' clocks may disagree). ``skew`` is pure: which replicas serve another
(policy, calibration) pair than most do.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import msgspec
import redis.asyncio as aioredis

from cascade.schema import FleetView, ReplicaSeen

PREFIX = "cascade:fleet:replica:"
_decoder = msgspec.json.Decoder(ReplicaSeen)


def skew(replicas: Sequence[ReplicaSeen]) -> FleetView:
    """The view of ``replicas``: the (policy, calibration) hashes most serve (a tie goes to the
    pair served by the replica first by name), and those serving another."""
    ordered = sorted(replicas, key=lambda seen: seen.replica)
    pairs = Counter((seen.policy_hash, seen.calibration_hash) for seen in ordered)
    if not pairs:
        return FleetView(replicas=[], policy_hash=None, calibration_hash=None, skew=0,
                         skewed=[])
    majority = pairs.most_common(1)[0][0]  # ties: the first counted, i.e. by name
    skewed = [seen.replica for seen in ordered
              if (seen.policy_hash, seen.calibration_hash) != majority]
    return FleetView(replicas=ordered, policy_hash=majority[0], calibration_hash=majority[1],
                     skew=len(skewed), skewed=skewed)


class Registry:
    """Heartbeats in ``client``'s Redis. Calls raise ``redis.RedisError`` (the client's
    timeouts bound them)."""

    def __init__(self, client: aioredis.Redis, seen_s: float) -> None:
        self.client, self.seen_s = client, seen_s

    @staticmethod
    def key(replica: str) -> str:
        return PREFIX + replica

    async def beat(self, seen: ReplicaSeen) -> None:
        """This replica is alive and serves ``seen`` (for ``seen_s`` from now)."""
        await self.client.set(self.key(seen.replica), msgspec.json.encode(seen),
                              px=math.ceil(self.seen_s * 1000))

    async def seen(self) -> list[ReplicaSeen]:
        """The replicas whose heartbeat is alive, with its age."""
        keys = [key async for key in self.client.scan_iter(match=PREFIX + "*", count=500)]
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
            pipe.pttl(key)
        found = await pipe.execute()
        replicas = []
        for raw, ttl_ms in zip(found[::2], found[1::2], strict=True):
            if raw is None or ttl_ms < 0:  # expired between SCAN and GET
                continue
            try:
                seen = _decoder.decode(raw)
            except msgspec.DecodeError:  # not a heartbeat this version can read: not counted
                continue
            seen.age_s = round(max(self.seen_s - ttl_ms / 1000, 0.0), 3)
            replicas.append(seen)
        return replicas
