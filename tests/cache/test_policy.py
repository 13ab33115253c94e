"""``[cache]`` in a policy file: absent is off, a table is on, bad values name their line."""

from __future__ import annotations

from cascade.policy.files import check_text, format_finding

BASE = """
[tiers.laya]
kind = "laya"
checkpoints = { english = "/x" }

[route]
cheap = "laya"
"""


def test_absent_is_off_and_a_table_is_on() -> None:
    off, _ = check_text(BASE)
    on, _ = check_text(BASE + "\n[cache]\nmax_bytes = 1048576\nshared = true\n")
    assert off is not None and not off.cache.enabled
    assert on is not None and on.cache.enabled and on.cache.shared
    assert on.cache.max_bytes == 1 << 20


def test_bad_values_are_errors_with_their_line() -> None:
    text = BASE + '\n[cache]\nmax_bytes = 0\nttl_s = -1\nbackend = "redis"\n'
    policy, found = check_text(text)
    assert policy is None
    lines = [format_finding("p.toml", text, f) for f in found if f.severity == "error"]
    assert "p.toml:10: error: `cache.max_bytes`: Expected `int` >= 1" in lines
    assert "p.toml:11: error: `cache.ttl_s`: Expected `float` > 0.0" in lines
    assert any(
        line.startswith("p.toml:12: error: cache.backend") or "cache.url" in line for line in lines
    )
    policy, found = check_text(BASE + '\n[cache]\nbackend = "redis"\nurl = "http://x"\n')
    assert policy is None and any("not a redis://" in f.message for f in found)
    policy, found = check_text(BASE + "\n[cache]\nnope = 1\n")
    assert policy is None and any("unknown key `nope`" in f.message for f in found)


def test_charge_cached_is_a_rate_in_0_1_default_0() -> None:
    policy, _ = check_text(BASE + "\n[cache]\n")
    assert policy is not None and policy.cache.charge_cached == 0.0
    half, _ = check_text(BASE + "\n[cache]\ncharge_cached = 0.5\n")
    assert half is not None and half.cache.charge_cached == 0.5
    for bad, bound in (("1.5", "<= 1.0"), ("-0.1", ">= 0.0")):
        text = BASE + f"\n[cache]\ncharge_cached = {bad}\n"
        policy, found = check_text(text)
        assert policy is None
        assert [format_finding("p.toml", text, f) for f in found] == [
            f"p.toml:10: error: `cache.charge_cached`: Expected `float` {bound}"
        ]
