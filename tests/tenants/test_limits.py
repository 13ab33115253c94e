"""Per-tenant limits on a fake clock: GCRA's arithmetic, each limit, headers, Retry-After."""

from __future__ import annotations

import asyncio

import pytest

from cascade import metrics
from cascade.errors import Overloaded, TenantLimited
from cascade.tenants.admission import Grant, TenantAdmission, reset_text
from cascade.tenants.limits import BackendFailed, Check, Gcra, LimitLevel, LimitVerdict, LocalStore
from cascade.tenants.model import Tenant, TenantLimits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_gcra_bursts_to_the_limit_then_refills_one_unit_per_period() -> None:
    gcra, now = Gcra(), 0.0
    take = [Check("t:requests", 3)]
    assert [gcra.admit(take, now).allowed for _ in range(4)] == [True, True, True, False]
    refused = gcra.admit(take, now)
    assert refused.retry_after_s == pytest.approx(20.0)  # one unit every 60/3 s
    assert refused.levels[0].remaining == 0 and refused.levels[0].reset_s == pytest.approx(60)
    assert not gcra.admit(take, 19.9).allowed
    got = gcra.admit(take, 20.0)
    assert got.allowed and got.levels[0].remaining == 0
    assert gcra.admit(take, 60.0).levels[0].remaining == 1  # 40 s later: two back, one taken


def test_every_unit_of_an_odd_limit_fits_despite_rounding() -> None:
    gcra = Gcra()
    results = [gcra.admit([Check("k", 7)], 0.0).allowed for _ in range(8)]
    assert results == [True] * 7 + [False]


def test_an_admission_is_all_or_nothing() -> None:
    gcra = Gcra()
    gcra.admit([Check("q", 10, cost=9)], 0.0)
    refused = gcra.admit([Check("r", 5), Check("q", 10, cost=2)], 0.0)
    assert not refused.allowed and "r" not in gcra.tat  # the request limit was not charged


def test_a_request_larger_than_the_limit_passes_on_a_full_bucket_and_leaves_a_debt() -> None:
    gcra = Gcra()
    assert gcra.admit([Check("q", 10, cost=25)], 0.0).allowed
    assert not gcra.admit([Check("q", 10, cost=1)], 0.0).allowed
    assert gcra.admit([Check("q", 10, cost=1)], 0.0).retry_after_s == pytest.approx(96.0)


def test_peek_refuses_only_once_over_and_look_never_refuses() -> None:
    gcra = Gcra()
    peek, look = Check("tok", 100, mode="peek"), Check("tok", 100, mode="look")
    assert gcra.admit([peek], 0.0).allowed
    gcra.charge("tok", 100, 150, 0.0)  # known after the answer: over by 50
    assert not gcra.admit([peek], 0.0).allowed
    seen = gcra.admit([look], 0.0)
    assert seen.allowed and seen.levels[0].remaining == 0
    assert gcra.admit([peek], 31.0).allowed  # 90 s of debt minus 60 s of window, plus one


ACME = Tenant(
    name="acme",
    limits=TenantLimits(
        requests_per_min=2,
        questions_per_min=5,
        input_tokens_per_min=100,
        max_inflight=1,
        strong_questions_per_min=3,
    ),
)


def test_requests_over_the_limit_are_429_with_retry_after_and_counted() -> None:
    clock = Clock()
    admission = TenantAdmission(LocalStore(clock))
    before = metrics.TENANT_LIMITED.labels(tenant="acme", limit="requests_per_min")._value.get()
    grants = [Grant(), Grant()]
    for grant in grants:
        run(admission.before_body(ACME, grant))
    assert grants[1].headers == {
        "x-ratelimit-limit-requests": "2",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1m0s",
        "x-ratelimit-limit-tokens": "100",
        "x-ratelimit-remaining-tokens": "100",
        "x-ratelimit-reset-tokens": "0ms",
    }
    third = Grant()
    with pytest.raises(TenantLimited, match="requests_per_min") as refused:
        run(admission.before_body(ACME, third))
    assert refused.value.retry_after == pytest.approx(30.0)
    assert third.headers["x-ratelimit-remaining-requests"] == "0"
    after = metrics.TENANT_LIMITED.labels(tenant="acme", limit="requests_per_min")._value.get()
    assert after == before + 1
    clock.now += 30
    run(admission.before_body(ACME, Grant()))


def test_questions_are_charged_once_known_and_refused_over_the_limit() -> None:
    admission = TenantAdmission(LocalStore(Clock()))
    grant = Grant()
    run(admission.after_decode(ACME, 4, grant))
    assert grant.headers["x-ratelimit-remaining-questions"] == "1"
    with pytest.raises(TenantLimited, match="questions_per_min") as refused:
        run(admission.after_decode(ACME, 2, Grant()))
    assert refused.value.retry_after == pytest.approx(12.0)  # one question every 12 s


def test_input_tokens_are_charged_after_and_refuse_the_next_request() -> None:
    clock = Clock()
    admission = TenantAdmission(LocalStore(clock))
    run(admission.before_body(ACME, Grant()))
    run(admission.charge(ACME, tokens=130, strong=0))  # the answer's tokens: over by 30
    with pytest.raises(TenantLimited, match="input_tokens_per_min") as refused:
        run(admission.before_body(ACME, Grant()))
    assert refused.value.retry_after == pytest.approx(18.6)  # 30 tokens + 1, 0.6 s each
    clock.now += 18.6
    grant = Grant()
    run(admission.before_body(ACME, grant))
    assert grant.headers["x-ratelimit-remaining-tokens"] == "1"


def test_the_tokens_headers_show_the_level_after_the_charge() -> None:
    """The answer's tokens are charged before its response goes out: ``remaining`` is what is
    left after them (it showed the level before: 100 for a 30-token answer)."""
    admission = TenantAdmission(LocalStore(Clock()))
    grant = Grant()
    run(admission.before_body(ACME, grant))
    assert grant.headers["x-ratelimit-remaining-tokens"] == "100"
    run(admission.charge(ACME, tokens=30, strong=1, grant=grant))
    assert grant.headers["x-ratelimit-remaining-tokens"] == "70"
    assert grant.headers["x-ratelimit-reset-tokens"] == "18s"


def test_a_request_reserves_its_strong_answers_from_what_the_tenant_has_left() -> None:
    """ACME has 3 strong answers a minute: requests in flight reserve them (a concurrent
    request sees what the others reserved), the answer charges what was used, and a request
    over the quota gets none, with the time one more comes back."""
    clock = Clock()
    admission = TenantAdmission(LocalStore(clock))
    acme = Tenant(name="acme", limits=TenantLimits(strong_questions_per_min=3))
    first, second = Grant(), Grant()
    run(admission.after_decode(acme, 2, first))
    run(admission.after_decode(acme, 2, second))
    assert first.quota is not None and second.quota is not None
    assert (first.quota.left, second.quota.left) == (2, 1)
    run(admission.charge(acme, tokens=0, strong=3))
    admission.release(acme, first)
    admission.release(acme, second)
    assert not admission.strong_reserved
    over = Grant()
    run(admission.after_decode(acme, 1, over))
    assert over.quota is not None and over.quota.left == 0
    assert over.quota.retry_after_s == pytest.approx(20.0)  # one strong question every 20 s
    with pytest.raises(TenantLimited, match="strong_questions_per_min"):
        raise over.quota.refusal()
    clock.now += 20  # one strong question back
    back = Grant()
    run(admission.after_decode(acme, 5, back))
    assert back.quota is not None and back.quota.left == 1


def test_max_inflight_counts_the_states_of_a_batch() -> None:
    admission = TenantAdmission(LocalStore(Clock()))
    four = Tenant(name="four", limits=TenantLimits(max_inflight=4))
    with admission.permit(four), pytest.raises(TenantLimited, match="65 states in flight"):
        with admission.permit(four, 64):
            pass
    with admission.permit(four), admission.permit(four, 3):
        assert admission.inflight["four"] == 4
    assert not admission.inflight


def test_max_inflight_is_per_tenant_and_never_waits() -> None:
    admission = TenantAdmission(LocalStore(Clock()))
    other = Tenant(name="beta", limits=TenantLimits(max_inflight=1))
    with admission.permit(ACME):
        with pytest.raises(TenantLimited, match="max_inflight"):
            with admission.permit(ACME):
                pass
        with admission.permit(other):  # another tenant is not affected
            pass
    with admission.permit(ACME):
        pass
    assert not admission.inflight


def test_reset_is_written_as_openai_does() -> None:
    assert [reset_text(s) for s in (0.0, 0.0201, 1.5, 59.9994, 60, 360.2)] == [
        "0ms",
        "21ms",
        "1.5s",
        "59.999s",
        "1m0s",
        "6m0s",
    ]


class Failing:
    async def admit(self, checks: list[Check]) -> LimitVerdict:
        raise BackendFailed("down")

    async def charge(self, checks: list[Check]) -> list[LimitLevel]:
        raise BackendFailed("down")

    async def aclose(self) -> None:
        return None


def test_a_failed_backend_is_counted_and_fails_open_or_closed() -> None:
    errors = metrics.LIMITS_BACKEND_ERRORS.labels(backend="redis")
    before = errors._value.get()
    opened = TenantAdmission(Failing(), backend="redis", on_error="open")
    grant = Grant()
    run(opened.before_body(ACME, grant))
    run(opened.after_decode(ACME, 1, grant))
    run(opened.charge(ACME, tokens=5, strong=1))
    assert grant.quota is None and grant.headers == {}  # no cap on the strong tier
    closed = TenantAdmission(Failing(), backend="redis", on_error="closed")
    with pytest.raises(Overloaded, match="limits backend") as refused:
        run(closed.before_body(ACME, Grant()))
    assert not isinstance(refused.value, TenantLimited) and refused.value.retry_after == 1.0
    assert errors._value.get() == before + 4  # the charge's two limits: one call
