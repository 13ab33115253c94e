"""``[control]`` in a policy: decoded, absent by default, and checked with FILE:LINE findings."""

from __future__ import annotations

from pathlib import Path

from cascade.policy.files import check_text, format_finding
from cascade.policy.model import Targets

DEFAULT = (Path(__file__).parents[2] / "cascade/policy/default.toml").read_text()


def findings(extra: str) -> list[str]:
    text = DEFAULT + "\n" + extra
    _, found = check_text(text)
    return [format_finding("p.toml", text, f) for f in found]


def test_absent_by_default_and_decoded_when_present() -> None:
    policy, _ = check_text(DEFAULT)
    assert policy is not None and policy.control is None
    policy, found = check_text(
        DEFAULT + "\n[control]\nmax_strong_share = 0.25\n"
        'target_accuracy = { choice = 0.9 }\nprefer = "accuracy"\n'
    )
    assert policy is not None and policy.control is not None, found
    assert policy.control.max_strong_share == 0.25 and policy.control.window_s == 300
    assert policy.control.target_accuracy == Targets(choice=0.9)
    assert policy.control.target("choice") == 0.9 and policy.control.target("noul") is None


def test_every_bad_key_is_reported_on_its_line() -> None:
    lines = DEFAULT.count("\n") + 2
    got = findings(
        "[control]\nmax_strong_share = 1.5\nwindow_s = 0\n"
        "target_accuracy = { choice = 0.9, noul = 1.0 }\n"
        "min_threshold = 0.9\nmax_threshold = 0.5\n"
    )
    assert got == [
        f"p.toml:{lines + 1}: error: `control.max_strong_share`: Expected `float` <= 1.0",
        f"p.toml:{lines + 2}: error: `control.window_s`: Expected `float` > 0.0",
        f"p.toml:{lines + 3}: error: `control.target_accuracy.noul`: Expected `float` < 1.0",
        f"p.toml:{lines + 5}: error: control.max_threshold must be >= min_threshold",
    ]
    assert findings("[control]\ntarget_accuracy = { chioce = 0.9 }\n") == [
        f"p.toml:{lines + 1}: error: unknown key `chioce` (known: choice, noul, score)"
    ]
    assert findings("[control]\nbudget = 0.2\n")[0].startswith(
        f"p.toml:{lines + 1}: error: unknown key `budget` (known: capacity,"
    )


def test_warnings_name_what_cannot_work() -> None:
    got = findings('[control]\nprefer = "accuracy"\nmin_labels = 10\ntarget_accuracy = 0.9\n')
    assert got == [
        f"p.toml:{DEFAULT.count(chr(10)) + 4}: warning: 10 labels, all right, certify "
        "only 0.741 at 95 %: a cell fitted on so few for 0.9 escalates everything"
    ]
    got = findings('[control]\nprefer = "accuracy"\n')
    assert any("without a target_accuracy" in g for g in got)
    no_shadow = DEFAULT.replace("fraction = 0.02", "fraction = 0.0")
    _, found = check_text(no_shadow + '\n[control]\nteacher = "feedback+shadow"\n')
    assert any("no shadow answers" in f.message for f in found)


def test_control_needs_both_tiers() -> None:
    text = (
        '[tiers.laya]\nkind = "laya"\ncheckpoints = { english = "x" }\n'
        '[route]\ncheap = "laya"\n[control]\nmax_strong_share = 0.2\n'
    )
    policy, found = check_text(text)
    assert policy is None
    assert [format_finding("p.toml", text, f) for f in found] == [
        "p.toml:6: error: [control] moves the gate between a cheap and a strong tier; route "
        "needs both"
    ]


def test_max_tenant_share_is_a_share_checked_on_its_line() -> None:
    policy, _ = check_text(DEFAULT + "\n[control]\ntarget_accuracy = 0.9\n")
    assert policy is not None and policy.control is not None
    assert policy.control.max_tenant_share == 0.5
    lines = DEFAULT.count("\n") + 2
    for bad, bound in (("1.5", "<= 1.0"), ("-0.1", ">= 0.0")):
        assert findings(f"[control]\nmax_tenant_share = {bad}\n") == [
            f"p.toml:{lines + 1}: error: `control.max_tenant_share`: Expected `float` {bound}"
        ]
    assert findings("[control]\nmax_tenant_share = nan\n") == [
        f"p.toml:{lines + 1}: error: `control.max_tenant_share` must be a finite number, not nan"
    ]
    assert findings("[control]\nmax_tenant_share = 1.0\n") == []


def test_the_fleet_scope_needs_the_redis_it_shares() -> None:
    lines = DEFAULT.count("\n") + 2
    assert findings('[control]\nscope = "fleet"\nsync_s = 0\n') == [
        f"p.toml:{lines + 2}: error: `control.sync_s`: Expected `float` > 0.0",
        f'p.toml:{lines}: error: scope = "fleet" needs url, the Redis the replicas share',
    ]
    assert any(
        "each replica paces alone" in f
        for f in findings('[control]\nurl = "redis://127.0.0.1:6379/0"\n')
    )
    policy, found = check_text(
        DEFAULT + '\n[control]\nscope = "fleet"\nurl = "redis://127.0.0.1:6379/0"\n'
    )
    assert policy is not None and policy.control is not None and not found
    assert policy.control.scope == "fleet" and policy.control.sync_s == 1.0
