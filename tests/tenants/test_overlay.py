"""A tenant's policy: an overlay merged key by key onto the gateway's, or a whole policy file
with the gateway's tiers; checked as a policy file is, at the overlay's lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.policy.files import PolicyError
from cascade.policy.model import Checkpoints, LayaTier, Models, Policy, Route, UpstreamTier
from cascade.tenants.overlay import OVERLAY_TABLES, tenant_policy

BASE = Policy(
    tiers={
        "laya": LayaTier(checkpoints=Checkpoints(english="/ckpt")),
        "clef": UpstreamTier(urls=["http://127.0.0.1:9"]),
    },
    route=Route(cheap="laya", strong="clef"),
    models=Models(cheap_only=["fast"]),
)


def test_an_overlay_changes_only_the_keys_it_sets(tmp_path: Path) -> None:
    path = tmp_path / "acme.toml"
    path.write_text(
        '[thresholds.confidence.choice]\n"2" = 0.8\n\n[models]\nstrong_only = ["best"]\n'
    )
    policy = tenant_policy(path, BASE, where="keys.toml:3")
    assert policy.thresholds.confidence.choice.get("2") == 0.8
    assert policy.models.strong_only == ["best"] and policy.models.cheap_only == ["fast"]
    assert policy.tiers == BASE.tiers and policy.route == BASE.route
    assert OVERLAY_TABLES == ("thresholds", "models", "calibration")


def test_a_whole_policy_must_run_the_gateways_tiers(tmp_path: Path) -> None:
    path = tmp_path / "acme.toml"
    path.write_text(
        'description = "x"\n[tiers.other]\nkind = "upstream"\n'
        'urls = ["http://127.0.0.1:9"]\n[route]\nstrong = "other"\n'
    )
    with pytest.raises(PolicyError, match=r"acme.toml:2: error: a tenant's policy must run"):
        tenant_policy(path, BASE, where="keys.toml:3")


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('[models]\nstrong_only = ["fast"]\n', 2, "listed in both"),
        ("\n[thresholds]\nbogus = 1\n", 3, "unknown key `bogus`"),
        ('[calibration]\nfile = "missing.toml"\n', 2, "missing.toml"),
        ("[models\n", 1, "invalid TOML"),
    ],
)
def test_an_overlay_is_checked_as_a_policy_file(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    path = tmp_path / "acme.toml"
    path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        tenant_policy(path, BASE, where="keys.toml:3")
    assert caught.value.messages[0].startswith(f"{path}:{line}: error: ")
    assert words in caught.value.messages[0]
