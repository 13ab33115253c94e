"""Policies built from settings (``--upstream``, ``--laya``, ``--clef``) instead of a file."""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec
import pytest

from cascade.build import DEFAULT_POLICY, NoTiers, demo_policy, policy_from_settings
from cascade.laya.config import load_config
from cascade.laya.tiny import write_random
from cascade.policy.files import load_policy, validate
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


def test_the_demo_is_the_default_policy_on_tiny_checkpoints(tmp_path: Path) -> None:
    """policies/default.toml as it is (the file the package ships), the tiers' weights swapped
    for tiny ones that read rows as Laya's English checkpoint does; a demo directory an older
    cascade wrote (a 96-token tiny Laya) is rewritten, never served."""
    write_random(tmp_path / "laya-english", agent={"max_len": 96, "head_max_len": 48})
    policy = demo_policy(tmp_path, Settings(demo=True, demo_dir=str(tmp_path)))
    default = load_policy(Path(__file__).parents[1] / "policies" / "default.toml")
    assert (
        DEFAULT_POLICY.read_bytes()
        == (DEFAULT_POLICY.parents[2] / "policies" / "default.toml").read_bytes()
    )
    same = msgspec.structs.replace(
        policy, tiers=default.tiers, shadow=default.shadow, description=default.description
    )
    assert same == default and policy.shadow.fraction == 0.25
    laya, clef = policy.tiers["laya"], policy.tiers["clef"]
    assert isinstance(laya, LayaTier) and isinstance(clef, ClefTier)
    named = laya.checkpoints.named()
    assert named == {
        "english": str(tmp_path / "laya-english"),
        "multilingual": str(tmp_path / "laya-multilingual"),
    }
    assert (
        msgspec.structs.replace(laya, checkpoints=default.tiers["laya"].checkpoints)
        == (default.tiers["laya"])
    )
    assert clef.release == str(tmp_path / "clef-flash") and clef.device == "cpu"
    assert (
        msgspec.structs.replace(clef, release="Cloudflare/clef-flash", device="cuda")
        == (default.tiers["clef"])
    )
    for path in named.values():
        cfg = load_config(Path(path))
        assert (cfg.max_len, cfg.head_max_len) == (512, 192)


def test_replicas_rewriting_one_demo_directory_never_show_a_half_written_file(
    tmp_path: Path,
) -> None:
    """Replicas booting at once with ``--demo`` rewrite the same checkpoint files while others
    load them: every read sees a whole file (it failed 137 of 41,880 reads before, the tokenizer
    half written)."""
    settings = Settings(demo=True, demo_dir=str(tmp_path))
    demo_policy(tmp_path, settings)
    whole = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    done = threading.Event()

    def rewrite() -> None:
        try:
            for _ in range(30):
                demo_policy(tmp_path, settings)
        finally:
            done.set()

    writer = threading.Thread(target=rewrite)
    writer.start()
    torn, reads = set(), 0
    while not done.is_set():
        for path, data in whole.items():
            reads += 1
            if (path.read_bytes() if path.exists() else b"") != data:
                torn.add(path.name)
    writer.join()
    assert reads > len(whole) and torn == set()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left
