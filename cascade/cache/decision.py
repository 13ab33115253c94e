"""``DecisionCache``: answers tier calls from earlier identical ones; one ``Lookup`` a request.

The gateway hands each tier call of a request to its ``Lookup`` with the function that really
calls the tier. The flow's decisions stay the flow's: the cache only answers tier calls, with
the bytes the tier gave for the same key (``cascade.cache.keys``), so the response built from a
cached answer is the response built from a fresh one (its ``timings_s`` measure this request:
the time it spent on each tier call, cached or not; its usage says which tokens were cached).

A tier that answers each question alone is looked up per question: a call whose questions are
partly cached sends the tier only the others. A joint tier's call is one entry. Misses already
being computed by another request are awaited, not recomputed (``cascade.cache.flight``).
``cache-control: no-cache`` (or ``max-age=0``) on a request skips the lookups and stores the
fresh answers; ``no-store`` skips both. Nothing fails because of the cache: values it cannot
read are misses. An answer says how many of its input tokens came from the cache
(``EngineUsage.cached_tokens``): what the tenant is charged at ``[cache] charge_cached``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal, Protocol

import msgspec

from cascade import metrics
from cascade.cache import keys as cache_keys
from cascade.cache import parts
from cascade.cache.flight import Abandoned, Flights, wait
from cascade.cache.keys import Version
from cascade.cache.store import CacheStore, MemoryStore
from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.base import Engine, answers_each_question
from cascade.policy.fingerprint import calibration_hash, policy_hash
from cascade.policy.model import Cache, Policy
from cascade.policy.serving import Serving

CacheControl = Literal["use", "no-cache", "no-store"]
Compute = Callable[[EngineCall], Awaitable[EngineAnswer]]
TierIds = Callable[[Policy], Mapping[str, str]]
_JOINT = ""  # the one entry of a joint tier's call
_VERSIONS = 4  # policy versions whose hashes are kept (a reload makes a new one)


def cache_control(header: str) -> CacheControl:
    """A request's ``Cache-Control`` header as the cache reads it; ``max-age=0`` is
    ``no-cache`` (RFC 9111 5.2.1.1: no stored answer is fresh enough)."""
    directives = {}
    for part in header.split(","):
        name, _, value = part.partition("=")
        directives[name.strip().lower()] = value.strip().strip('"')
    if "no-store" in directives:
        return "no-store"
    max_age = directives.get("max-age", "")
    if "no-cache" in directives or (max_age.isdigit() and int(max_age) == 0):
        return "no-cache"
    return "use"


def combined(outcomes: list[str]) -> str:
    """One ``x-cascade-cache`` value for several requests' (a batch's states)."""
    found = set(outcomes)
    return found.pop() if len(found) == 1 else "partial"


class Driver(Protocol):
    """What a lookup reads of the gateway that drives the request."""

    @property
    def engines(self) -> Mapping[str, Engine]: ...

    @property
    def profile(self) -> str: ...

    async def _call(
        self, serving: Serving, tier: str, call: EngineCall, timings: dict[str, float]
    ) -> EngineAnswer: ...


class DecisionCache:
    """The cache of one gateway. ``tier_ids``: each tier's content id under a policy (its
    weights' hash, an upstream's URLs and model); computed once per policy version."""

    def __init__(
        self, config: Cache, store: CacheStore, *, tier_ids: TierIds = lambda policy: {}
    ) -> None:
        self.config = config
        self.store = store
        self.flights = Flights()
        self._tier_ids = tier_ids
        self._versions: list[tuple[Policy, Version]] = []

    def version(self, policy: Policy) -> Version:
        """The key parts ``policy`` contributes (hashed once per policy object)."""
        for known, version in self._versions:
            if known is policy:
                return version
        version = self._identity(policy)
        self._keep(policy, version)
        return version

    def prepare(self, serving: Serving) -> Callable[[], None]:
        """A reconfiguration hook (``cascade.policy.serving``): the next version's key parts,
        computed now (the tiers' weights hashed, off the event loop when a reload prepares
        it), kept by the returned step, so its first request hashes nothing."""
        version = self._identity(serving.policy)
        return lambda: self._keep(serving.policy, version)

    def _identity(self, policy: Policy) -> Version:
        return Version(
            policy=policy_hash(policy),
            calibration=calibration_hash(policy),
            tiers=dict(self._tier_ids(policy)),
        )

    def _keep(self, policy: Policy, version: Version) -> None:
        self._versions = [(policy, version), *self._versions[: _VERSIONS - 1]]

    def lookup(
        self, driver: Driver, serving: Serving, *, tenant: str, control: CacheControl
    ) -> Lookup:
        """The lookup of one request, under the version it is served on (the request's
        version: its flow reads the same)."""
        if control != "use":
            metrics.CACHE_BYPASS.inc()
        namespace = "" if self.config.shared else tenant
        return Lookup(
            self,
            self.version(serving.policy),
            driver,
            serving,
            namespace=namespace,
            control=control,
        )

    def size(self) -> tuple[int, int]:
        """The in-memory store's bytes and entries (0, 0 for another store)."""
        store = self.store
        return (store.bytes, len(store)) if isinstance(store, MemoryStore) else (0, 0)

    async def aclose(self) -> None:
        await self.store.aclose()


class Lookup:
    """One request's tier calls through the cache; ``outcome`` is its ``x-cascade-cache``."""

    def __init__(
        self,
        cache: DecisionCache,
        version: Version,
        driver: Driver,
        serving: Serving,
        *,
        namespace: str,
        control: CacheControl,
    ) -> None:
        self.cache, self.version, self.driver, self.serving = cache, version, driver, serving
        self.engines, self.profile = driver.engines, driver.profile
        self.namespace, self.control = namespace, control
        self.hits = self.misses = 0

    @property
    def outcome(self) -> str:
        if self.control != "use":
            return "bypass"
        if self.hits and not self.misses:
            return "hit"
        return "partial" if self.hits else "miss"

    @property
    def header(self) -> dict[str, str]:
        return {"x-cascade-cache": self.outcome}

    async def call(self, tier: str, call: EngineCall, timings: dict[str, float]) -> EngineAnswer:
        """``call``'s answer from ``tier``: cached, from the driver's tier call, or both. Its
        time goes to ``timings[tier]``, whichever it was."""
        before, started = timings.get(tier, 0.0), time.perf_counter()

        async def compute(sub: EngineCall) -> EngineAnswer:
            return await self.driver._call(self.serving, tier, sub, timings)

        try:
            return await self._answer(tier, call, compute)
        finally:
            timings[tier] = before + time.perf_counter() - started

    async def _answer(self, tier: str, call: EngineCall, compute: Compute) -> EngineAnswer:
        if not call.questions:
            return await compute(call)
        each = answers_each_question(self.engines[tier])
        prefix = cache_keys.call_prefix(
            self.version, namespace=self.namespace, tier=tier, profile=self.profile, call=call
        )
        keys = (
            cache_keys.question_keys(prefix, call)
            if each
            else {_JOINT: cache_keys.joint_key(prefix, call)}
        )
        if self.control != "use":
            answer = await compute(call)
            if self.control == "no-cache":
                await self.cache.store.put_many(_values(each, keys, answer))
            return answer
        store, flights = self.cache.store, self.cache.flights
        found = dict(zip(keys.values(), await store.get_many(list(keys.values())), strict=True))
        values = {key: value for key, value in found.items() if value is not None}
        missing = {ids: key for ids, key in keys.items() if key not in values}
        self._count(
            tier, 1 if each else len(call.questions), len(keys) - len(missing), len(missing)
        )
        stored = set(values)  # found in the cache: its tokens are the answer's cached_tokens
        if not missing:
            return await self._assembled(call, each, keys, values, compute, stored)
        led, waiting = flights.claim(missing.values())
        if waiting:
            metrics.CACHE_COALESCED.labels(tier=tier).inc(len(waiting))
        if led:
            leading = set(led)
            sub = _subcall(call, each, [ids for ids, key in missing.items() if key in leading])
            try:
                fresh = await compute(sub)
            except Exception as exc:
                flights.land({}, led, exc)
                raise
            except BaseException:  # cancelled: the waiters compute for themselves
                flights.land({}, led)
                raise
            computed = _values(each, keys, fresh)
            flights.land(computed, led)
            await store.put_many(computed)
            values.update(computed)
            if sub is call:  # nothing cached and nothing awaited: the tier's own answer
                return fresh
        for key, got in (await wait(waiting)).items():
            if isinstance(got, bytes):
                values[key] = got
            elif not isinstance(got, Abandoned):
                raise got  # the identical call in flight failed: so would this one
        return await self._assembled(call, each, keys, values, compute, stored)

    async def _assembled(
        self,
        call: EngineCall,
        each: bool,
        keys: Mapping[str, str],
        values: Mapping[str, bytes],
        compute: Compute,
        stored: set[str],
    ) -> EngineAnswer:
        """The answer from cached values, its ``cached_tokens`` those of the ``stored`` ones;
        what is still missing (its leader went away) or cannot be joined is computed now,
        whole."""
        if all(key in values for key in keys.values()):
            if each:
                found = {qid: parts.decode_part(values[key]) for qid, key in keys.items()}
                complete = {qid: part for qid, part in found.items() if part is not None}
                if len(complete) == len(found) and (joined := parts.join(call, complete)):
                    return _cached(
                        joined,
                        sum(
                            part.row_tokens for qid, part in complete.items() if keys[qid] in stored
                        ),
                    )
            elif (whole := parts.decode_answer(values[keys[_JOINT]])) is not None:
                return _cached(whole, whole.usage.input_tokens if keys[_JOINT] in stored else 0)
        return await compute(call)

    def _count(self, tier: str, weight: int, hits: int, misses: int) -> None:
        """Entries found and not found; ``weight``: questions an entry stands for."""
        self.hits += hits * weight
        self.misses += misses * weight
        metrics.CACHE_HITS.labels(tier=tier).inc(hits)
        metrics.CACHE_MISSES.labels(tier=tier).inc(misses)
        if hits and misses:
            metrics.CACHE_PARTIAL.labels(tier=tier).inc()


def _cached(answer: EngineAnswer, tokens: int) -> EngineAnswer:
    """``answer`` with ``tokens`` of its input counted as answered from the cache."""
    usage = msgspec.structs.replace(answer.usage, cached_tokens=tokens)
    return msgspec.structs.replace(answer, usage=usage)


def _subcall(call: EngineCall, each: bool, qids: list[str]) -> EngineCall:
    """``call`` with only ``qids`` (a joint tier always gets the whole call)."""
    if not each or len(qids) == len(call.questions):
        return call
    return msgspec.structs.replace(call, questions={q: call.questions[q] for q in qids})


def _values(each: bool, keys: Mapping[str, str], answer: EngineAnswer) -> dict[str, bytes]:
    """What to store of ``answer``: a part per question, or the whole answer (a per-question
    tier's answer without each row's tokens is not stored)."""
    if not each:
        return {keys[_JOINT]: parts.encode(answer)}
    split = parts.split(answer)
    if split is None:
        return {}
    return {keys[qid]: parts.encode(part) for qid, part in split.items() if qid in keys}


def build_cache(config: Cache, *, tier_ids: TierIds = lambda policy: {}) -> DecisionCache | None:
    """The cache ``[cache]`` describes, or None when it is off."""
    if not config.enabled:
        return None
    store: CacheStore
    if config.backend == "redis":
        from cascade.cache.redis_store import RedisCacheStore

        assert config.url is not None  # cascade.policy.files checks it
        store = RedisCacheStore(
            config.url, ttl_s=config.ttl_s, timeout_s=config.timeout_s, retry_s=config.retry_s
        )
    else:
        store = MemoryStore(max_bytes=config.max_bytes, ttl_s=config.ttl_s)
    return DecisionCache(config, store, tier_ids=tier_ids)
