"""A fleet reload over Redis pub/sub. ``ask`` subscribes to a reply channel of its own, publishes
a ``ReloadCall`` naming it on ``CHANNEL``, and collects one ``ReplicaReload`` per replica until as
many answered as ``PUBLISH`` said were listening, or ``timeout_s`` passed. ``listen`` is the other
side, one per replica: each call runs the replica's reload and publishes its outcome.

Pub/sub delivers to whoever listens now and keeps nothing: a replica that was disconnected
misses the call and is listed as not answered (it still reloads on its own file changes).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from cascade.schema import FleetReloadReport, ReplicaReload

log = logging.getLogger("cascade")
CHANNEL = "cascade:fleet:reload"
REPLY = "cascade:fleet:reply:"
REFUSED = ("rejected", "restart_needed")


class ReloadCall(msgspec.Struct, frozen=True):
    """What ``ask`` publishes: who asked, and where to answer."""

    origin: str
    reply: str


_call_decoder = msgspec.json.Decoder(ReloadCall)
_reply_decoder = msgspec.json.Decoder(ReplicaReload)


async def ask(
    client: aioredis.Redis, origin: str, timeout_s: float, seen: Callable[[], Awaitable[list[str]]]
) -> FleetReloadReport:
    """Every listening replica's outcome; ``seen()``: the replicas expected (their heartbeats),
    those without an answer are ``not_answered``. Raises ``RedisError``."""
    reply = REPLY + uuid.uuid4().hex
    answers: dict[str, ReplicaReload] = {}
    async with client.pubsub() as pubsub:
        await pubsub.subscribe(reply)  # before publishing: no answer can come before this
        listening = await client.publish(CHANNEL, msgspec.json.encode(ReloadCall(origin, reply)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(answers) < listening and (left := deadline - loop.time()) > 0:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
            if message is None or message["type"] != "message":
                continue
            try:
                answer = _reply_decoder.decode(message["data"])
            except msgspec.DecodeError:
                log.warning("fleet reload: an answer this version cannot read (ignored)")
                continue
            answers[answer.replica] = answer
    expected = set(await seen())
    replicas = [answers[name] for name in sorted(answers)]
    return FleetReloadReport(
        replicas=replicas,
        refused=[r.replica for r in replicas if r.outcome in REFUSED],
        not_answered=sorted(expected - set(answers)),
    )


async def listen(
    client: aioredis.Redis, reload: Callable[[], Awaitable[ReplicaReload]], retry_s: float
) -> None:
    """Answer every ``ReloadCall`` with ``reload()``'s outcome, until cancelled. A lost Redis
    is retried every ``retry_s`` (calls published meanwhile are missed, see above)."""
    while True:
        try:
            async with client.pubsub() as pubsub:
                await pubsub.subscribe(CHANNEL)
                async for message in pubsub.listen():
                    if message["type"] != "message":
                        continue
                    try:
                        call = _call_decoder.decode(message["data"])
                    except msgspec.DecodeError:
                        log.warning("fleet reload: a call this version cannot read (ignored)")
                        continue
                    log.info("fleet reload asked by %s", call.origin)
                    try:
                        outcome = await reload()
                    except Exception:  # unanswered (listed as such); the next call is heard
                        log.exception("fleet reload asked by %s failed", call.origin)
                        continue
                    await client.publish(call.reply, msgspec.json.encode(outcome))
        except (RedisError, OSError) as exc:
            log.warning("fleet reload: Redis lost (%s); listening again in %g s", exc, retry_s)
            await asyncio.sleep(retry_s)
