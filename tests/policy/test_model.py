"""Policy decoding and validation: strict keys, cross-references, thresholds, line numbers."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from cascade.policy.files import PolicyError, check_text, format_finding, load_policy, validate
from cascade.policy.model import ClefTier, LayaTier, Policy, UpstreamTier
from cascade.policy.routing import resolve_model
from cascade.policy.toml_keys import key_lines

POLICIES = sorted((Path(__file__).parents[2] / "policies").glob("*.toml"))

GOOD = """\
[tiers.laya]
kind = "laya"
checkpoints = { english = "./en" }

[tiers.clef]
kind = "clef"

[route]
cheap = "laya"
strong = "clef"
"""


def messages(text: str) -> list[str]:
    _, found = check_text(text)
    return [format_finding("p.toml", text, f) for f in found]


def test_the_shipped_policies_load_clean() -> None:
    assert {p.name for p in POLICIES} >= {
        "default.toml",
        "support-triage.toml",
        "latency-first.toml",
        "quality-first.toml",
    }
    for path in POLICIES:
        policy, found = check_text(path.read_text())
        assert policy is not None and found == [], (path.name, found)
        assert isinstance(load_policy(path), Policy)


def test_default_policy_shape() -> None:
    policy = load_policy(Path(__file__).parents[2] / "policies" / "default.toml")
    assert {resolve_model(policy, m) for m in ("jev-latest", "jev-preview", "jev-1.13.0")} == {
        "cascade"
    }
    assert policy.route.max_choice_options == 48
    assert isinstance(policy.tiers["laya"], LayaTier)
    assert isinstance(policy.tiers["clef"], ClefTier)
    assert policy.thresholds.confidence.choice.get("3-5") == 0.65
    assert policy.thresholds.confidence.noul.get("6-10") is None
    with pytest.raises(AttributeError):
        policy.route.cheap = "x"  # type: ignore[misc]


def test_the_ollama_policy_puts_laya_in_front_of_ollama() -> None:
    """``policies/ollama.toml`` (README, Serving real models): Laya in process is the cheap
    tier, Ollama's clef-flash on loopback the strong one, health-checked on Ollama's own path."""
    policy = load_policy(Path(__file__).parents[2] / "policies" / "ollama.toml")
    laya, clef = policy.tiers[policy.route.cheap], policy.tiers[policy.route.strong]
    assert isinstance(laya, LayaTier)
    assert laya.checkpoints.named() == {
        "english": "convaiinnovations/laya",
        "multilingual": "convaiinnovations/laya/multilingual",
    }
    assert isinstance(clef, UpstreamTier)
    assert clef.urls == ["http://127.0.0.1:11434"]
    assert (clef.model, clef.health_path) == ("clef-flash:9b", "/api/version")
    assert resolve_model(policy, "jev-latest") == "cascade"
    assert resolve_model(policy, "clef-flash") == "strong_only"


def test_defaults_of_a_minimal_policy() -> None:
    policy, found = check_text(GOOD)
    assert found == [] and policy is not None
    assert policy.models.cascade == ["jev-latest", "jev-*"]
    assert policy.models.unknown == "reject"
    assert policy.route.escalate == "questions"
    assert policy.thresholds.truncated and policy.thresholds.collapsed
    assert policy.breaker_for("clef").min_calls == 5


def test_unknown_keys_are_all_reported_with_their_lines() -> None:
    text = (
        GOOD.replace('kind = "clef"', 'kind = "clef"\ndevise = "cuda"').replace(
            'checkpoints = { english = "./en" }', 'checkpoints = { english = "./en", multi = "m" }'
        )
        + '\n[thresholds.confidence]\nchoice = { "2" = 0.6, "12" = 0.1 }\n'
    )
    assert messages(text) == [
        "p.toml:3: error: unknown key `multi` (known: english, multilingual, typed-decisions)",
        "p.toml:7: error: unknown key `devise` (known: device, download, kind, max_batch_size, "
        "max_batch_tokens, max_length, max_queue, memory_budget_bytes, overlong, release, "
        "timeout_s)",
        "p.toml:14: error: unknown key `12` (known: 11+, 2, 3-5, 6-10)",
    ]


def test_type_errors_point_at_the_key() -> None:
    text = GOOD.replace('strong = "clef"', 'strong = "clef"\nmax_choice_options = "many"')
    assert messages(text) == [
        "p.toml:11: error: `route.max_choice_options`: Expected `int`, got `str`"
    ]
    text = GOOD.replace('kind = "clef"', 'kind = "gpu"')
    assert messages(text) == [
        "p.toml:6: error: tier `clef`: kind must be one of ['clef', 'laya', 'upstream']"
    ]
    text = GOOD.replace('strong = "clef"', 'strong = "clef"\nescalate = "all"')
    assert messages(text) == ["p.toml:11: error: `route.escalate`: Invalid enum value 'all'"]


def test_missing_required_keys() -> None:
    assert messages("[route]\ncheap = 'x'\n") == [
        "p.toml:1: error: `policy` is missing the key `tiers`"
    ]
    text = GOOD.replace('checkpoints = { english = "./en" }\n', "")
    assert messages(text) == ["p.toml:1: error: `tiers.laya` is missing the key `checkpoints`"]


def test_invalid_toml_reports_the_parser_line() -> None:
    (line,) = messages(GOOD + "\n[route\n")
    assert line == (
        "p.toml:12: error: invalid TOML: Cannot declare ('route',) twice (at line 12, column 7)"
    )


def test_cross_references() -> None:
    text = GOOD.replace('strong = "clef"', 'strong = "gpu"') + "\n[breaker.gpu]\nmin_calls = 0\n"
    found = messages(text)
    assert "p.toml:10: error: route.strong names an undefined tier `gpu`" in found
    assert "p.toml:12: error: breaker for an undefined tier `gpu`" in found
    assert "p.toml:13: error: `breaker.gpu.min_calls`: Expected `int` >= 1" in found
    assert "p.toml:5: warning: tier `clef` is not used by [route]" in found
    # errors come before warnings
    assert [m.split(": ")[1] for m in found] == sorted(
        (m.split(": ")[1] for m in found), key=lambda s: s != "error"
    )


def test_rules_that_need_a_strong_tier() -> None:
    text = (
        GOOD.replace('strong = "clef"\n', 'strong_types = ["score"]\n').replace(
            '[tiers.clef]\nkind = "clef"\n', ""
        )
        + '[models]\nstrong_only = ["clef-flash"]\n'
        + '[thresholds.confidence]\nnoul = { "2" = 0.7 }\n[shadow]\nfraction = 0.1\n'
    )
    found = messages(text)
    assert (
        "p.toml:8: error: route.strong_types needs a strong tier, but route.strong is not set"
        in found
    )
    assert (
        "p.toml:10: error: models.strong_only needs a strong tier, but route.strong is not set"
        in found
    )
    assert (
        "p.toml:12: error: thresholds.confidence.noul needs a strong tier to escalate to" in found
    )
    assert "p.toml:14: error: shadow sampling needs a strong tier" in found


def test_thresholds_outside_the_unit_interval_and_impossible_ones() -> None:
    text = GOOD + (
        "[thresholds.confidence]\n"
        'choice = { "2" = 0.5, "3-5" = 1.5, "6-10" = 0.1, "11+" = 0.05 }\n'
        'score = { "3-5" = 0.2, "6-10" = 1.0 }\n'
        'noul = { "2" = 0.7, "3-5" = 0.7 }\n'
        '[thresholds.margin]\nchoice = { "2" = 0.0, "3-5" = -0.1 }\n'
    )
    found = messages(text)
    assert "p.toml:12: error: confidence threshold 1.5 is outside [0, 1]" in found
    assert "p.toml:16: error: margin threshold -0.1 is outside [0, 1]" in found
    assert (
        "p.toml:14: error: noul questions are always band \"2\"; band '3-5' never applies" in found
    )
    never = "can never be undercut"
    assert any(
        m.startswith("p.toml:12: warning: confidence threshold 0.5 ") and never in m for m in found
    )  # choice "2": max p >= 0.5
    assert any("threshold 0.1 " in m and never in m for m in found)  # 6-10: max p >= 0.1
    assert any("threshold 0.2 " in m and never in m for m in found)  # 3-5: max p >= 0.2
    assert not any("threshold 0.05 " in m for m in found)  # 11+ has no floor above 0
    assert (
        "p.toml:13: warning: confidence threshold 1.0 escalates every question of band 6-10"
        in found
    )
    assert (
        "p.toml:16: warning: margin threshold 0 never escalates (a margin is never below 0)"
        in found
    )
    assert not any("0.7" in m for m in found)


def test_tier_and_model_checks() -> None:
    text = GOOD.replace(
        'checkpoints = { english = "./en" }',
        'checkpoints = { english = "./en" }\ndefault_checkpoint = "multilingual"',
    )
    text += (
        '[tiers.up]\nkind = "upstream"\nurls = [\n  "http://a:1",\n  "ftp://b",\n]\n'
        '[models]\ncascade = ["x"]\ncheap_only = ["x"]\n'
    )
    found = messages(text)
    assert "p.toml:4: error: default_checkpoint `multilingual` is not in checkpoints" in found
    assert "p.toml:14: error: `ftp://b` is not an http(s) URL" in found
    assert (
        "p.toml:20: error: model `x` is listed in both models.cascade and models.cheap_only"
        in found
    )
    assert "p.toml:18: warning: `jev-latest` (the SDKs' default model) is not accepted" in found


def test_load_policy_raises_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(GOOD.replace('strong = "clef"', 'strong = "gpu"'))
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.messages == [f"{path}:10: error: route.strong names an undefined tier `gpu`"]


def test_single_tier_policies_validate() -> None:
    up = UpstreamTier(urls=["http://127.0.0.1:9000"])
    policy = Policy.single_tier("upstream", up)
    assert policy.route.strong == "upstream" and policy.route.cheap is None
    assert policy.models.unknown == "cascade"
    assert validate(policy) == []
    laya = msgspec.convert({"kind": "laya", "checkpoints": {"english": "./en"}}, LayaTier)
    policy = Policy.single_tier("laya", laya)
    assert policy.route.cheap == "laya" and policy.route.strong is None
    assert validate(policy) == []


def test_key_lines_follows_toml_syntax() -> None:
    text = """\
# a = [ comment with brackets {
top = 1
"quoted.key" = 'v # not a comment'
[a.b]
c.d = { e = 1, f = { g = "}" } }
arr = [
  "x = 1",
  ["y"],
]
after = 2
text = \"\"\"
z = 3
\"\"\"
[[tables]]
h = 1
"""
    lines = key_lines(text)
    assert lines[("top",)] == 2
    assert lines[("quoted.key",)] == 3
    assert lines[("a", "b")] == 4
    assert lines[("a", "b", "c", "d")] == 5
    assert lines[("a", "b", "c", "d", "f", "g")] == 5
    assert lines[("a", "b", "arr")] == 6
    assert lines[("a", "b", "after")] == 10
    assert ("a", "b", "z") not in lines and ("a", "b", "x") not in lines
    assert lines[("tables", "h")] == 15


def test_load_policy_anchors_relative_paths_at_the_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "p.toml"
    path.parent.mkdir()
    path.write_text(
        GOOD.replace(
            '{ english = "./en" }',
            '{ english = "../models/en", multilingual = "convaiinnovations/'
            'laya/multilingual", typed-decisions = "~/td" }',
        ).replace('kind = "clef"', 'kind = "clef"\nrelease = "./clef"')
    )
    policy = load_policy(path)
    laya, clef = policy.tiers["laya"], policy.tiers["clef"]
    assert isinstance(laya, LayaTier) and isinstance(clef, ClefTier)
    assert laya.checkpoints.named() == {
        "english": str(tmp_path.resolve() / "models" / "en"),
        "multilingual": "convaiinnovations/laya/multilingual",
        "typed-decisions": str(Path("~/td").expanduser()),
    }
    assert clef.release == str(tmp_path.resolve() / "conf" / "clef")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+nan"])
@pytest.mark.parametrize(
    ("table", "key", "line"),
    [
        ("tiers.clef", "timeout_s", 7),
        ("breaker.clef", "window_s", 13),
        ("breaker.clef", "cooldown_s", 13),
        ("degrade", "retry_after_s", 13),
        ("cost", "clef", 13),
        ("shadow", "fraction", 13),
    ],
)
def test_policy_numbers_must_be_finite(value: str, table: str, key: str, line: int) -> None:
    """TOML's nan and inf were accepted; with ``timeout_s = nan`` every strong call failed."""
    if table == "tiers.clef":
        text = GOOD.replace('kind = "clef"\n', f'kind = "clef"\n{key} = {value}\n')
    else:
        text = GOOD + f"\n[{table}]\n{key} = {value}\n"
    policy, found = check_text(text)
    assert policy is None
    assert f"p.toml:{line}: error: `{table}.{key}` must be a finite number, not {float(value)}" in [
        format_finding("p.toml", text, f) for f in found
    ]


def test_a_policy_file_that_is_not_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(GOOD.encode() + "# caf\xe9\n".encode("latin-1"))
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.messages == [
        f"{path}:11: error: not UTF-8 text (byte {len(GOOD) + 5}: invalid continuation byte)"
    ]


def test_an_unreadable_policy_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"missing\.toml: error: No such file"):
        load_policy(tmp_path / "missing.toml")
