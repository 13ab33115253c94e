"""Who is in the fleet: each replica's heartbeat is a Redis key that expires after ``seen_s``, so
the keys alive are the replicas seen within it, and its name goes in one sorted set (``INDEX``,
scored by Redis's clock, pruned as it is written) so reading the fleet never scans a keyspace it
may share with the decision cache. A heartbeat's age is read from its remaining TTL (Redis's
clock: replicas' clocks may disagree). ``skew`` is pure: which replicas serve another (policy,
calibration) pair than most do.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import cast

import msgspec
import redis.asyncio as aioredis

from cascade.schema import FleetView, ReplicaSeen

PREFIX = "cascade:fleet:replica:"
INDEX = "cascade:fleet:replicas"
# KEYS: the index, the replica's key; ARGV: its name, its heartbeat, seen_s in ms.
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
"""
_decoder = msgspec.json.Decoder(ReplicaSeen)


def skew(replicas: Sequence[ReplicaSeen]) -> FleetView:
    """The view of ``replicas``: the (policy, calibration) hashes most serve (a tie goes to the
    pair served by the replica first by name), and those serving another."""
    ordered = sorted(replicas, key=lambda seen: seen.replica)
    pairs = Counter((seen.policy_hash, seen.calibration_hash) for seen in ordered)
    if not pairs:
        return FleetView(replicas=[], policy_hash=None, calibration_hash=None, skew=0, skewed=[])
    majority = pairs.most_common(1)[0][0]  # ties: the first counted, i.e. by name
    skewed = [
        seen.replica for seen in ordered if (seen.policy_hash, seen.calibration_hash) != majority
    ]
    return FleetView(
        replicas=ordered,
        policy_hash=majority[0],
        calibration_hash=majority[1],
        skew=len(skewed),
        skewed=skewed,
    )


class Registry:
    """Heartbeats in ``client``'s Redis. Calls raise ``redis.RedisError`` (the client's
    timeouts bound them)."""

    def __init__(self, client: aioredis.Redis, seen_s: float) -> None:
        self.client, self.seen_s = client, seen_s
        self._beat = client.register_script(_BEAT)  # EVALSHA, loaded on first use

    @staticmethod
    def key(replica: str) -> str:
        return PREFIX + replica

    async def beat(self, seen: ReplicaSeen) -> None:
        """This replica is alive and serves ``seen`` (for ``seen_s`` from now)."""
        await self._beat(
            keys=[INDEX, self.key(seen.replica)],
            args=[seen.replica, msgspec.json.encode(seen), math.ceil(self.seen_s * 1000)],
        )

    async def leave(self, replica: str) -> None:
        """``replica`` is gone (it shuts down): no longer seen."""
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(self.key(replica))
        pipe.zrem(INDEX, replica)
        await pipe.execute()

    async def seen(self) -> list[ReplicaSeen]:
        """The replicas whose heartbeat is alive, with its age."""
        names = cast(list[bytes], await self.client.zrange(INDEX, 0, -1))
        keys = [self.key(name.decode()) for name in names]
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
