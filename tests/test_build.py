"""Policies built from settings (``--upstream``, ``--laya``, ``--clef``) instead of a file."""

from __future__ import annotations

import pytest

from cascade.build import NoTiers, policy_from_settings
from cascade.policy.files import validate
from cascade.policy.model import ClefTier, LayaTier, UpstreamTier
from cascade.settings import Settings, from_env


def test_upstream_is_a_one_tier_policy_accepting_any_model() -> None:
    policy = policy_from_settings(Settings(upstream="http://127.0.0.1:8100"))
    assert isinstance(policy.tiers["upstream"], UpstreamTier)
    assert policy.route.strong == "upstream" and policy.models.unknown == "cascade"
    assert not [f for f in validate(policy) if f.severity == "error"]


def test_laya_default_checkpoint_is_a_configured_one() -> None:
    policy = policy_from_settings(Settings(laya={"multilingual": "/ckpt/ml"}))
    tier = policy.tiers["laya"]
    assert isinstance(tier, LayaTier) and tier.default_checkpoint == "multilingual"
    assert not [f for f in validate(policy) if f.severity == "error"]
    bare = from_env({"CASCADE_LAYA": "/ckpt/en"})
    assert policy_from_settings(bare).tiers["laya"].checkpoints.english == "/ckpt/en"  # type: ignore[union-attr]


def test_laya_and_clef_make_a_cascade() -> None:
    policy = policy_from_settings(Settings(laya={"english": "/en"}, clef="/clef"))
    assert isinstance(policy.tiers["clef"], ClefTier)
    assert (policy.route.cheap, policy.route.strong) == ("laya", "clef")
    assert not [f for f in validate(policy) if f.severity == "error"]


def test_unknown_laya_names_and_no_tiers_say_what_to_do() -> None:
    with pytest.raises(NoTiers, match="english, multilingual, typed-decisions"):
        policy_from_settings(Settings(laya={"french": "/fr"}))
    with pytest.raises(NoTiers, match="--demo"):
        policy_from_settings(Settings())
