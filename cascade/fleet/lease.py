"""A lease in the fleet's Redis: at most one replica holds a key at a time, until ``ttl_s``
after its holder's last renewal.

A free lease is taken with ``SET key token NX PX ttl``; its holder renews it with a
compare-and-extend script (the key's time is extended only while it still holds the holder's
token), and gives it back the same way. A holder that stops renewing (killed, cut off from
Redis) loses it ``ttl_s`` after its last renewal, and the next replica to ask takes it. The
time is Redis's alone (``PX``): the replicas' clocks play no part.
"""

from __future__ import annotations

from typing import Any

RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class Lease:
    """``key`` held under ``token`` (unique to the holder: a replica's name and a random part)."""

    def __init__(self, key: str, token: str) -> None:
        self.key, self.token = key, token

    async def hold(self, redis: Any, ttl_s: float) -> bool:
        """Renew the lease if this token holds it, else take it if it is free; whether this
        token holds it now, for ``ttl_s``."""
        ms = max(1, round(ttl_s * 1000))
        if await redis.register_script(RENEW)(keys=[self.key], args=[self.token, ms]):
            return True
        return bool(await redis.set(self.key, self.token, nx=True, px=ms))

    async def release(self, redis: Any) -> bool:
        """Give the lease back if this token holds it (whether it did)."""
        return bool(await redis.register_script(RELEASE)(keys=[self.key], args=[self.token]))
