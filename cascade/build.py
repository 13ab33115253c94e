"""Settings → policy → engines → ``Gateway``. The only place that knows engine classes.

Policy sources, first match wins: ``--demo`` (the default policy, or ``--policy FILE``, on
tiny random checkpoints of both tiers, labelled as a demo everywhere); ``--policy FILE``;
``--upstream URL`` (a one-tier policy that forwards to any ``/v1/systemone`` server); ``--laya
DIR`` and/or ``--clef DIR`` (in-process tiers).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import msgspec

from cascade.cache.decision import build_cache
from cascade.engines.base import Engine
from cascade.errors import CascadeError, ConfigRejected
from cascade.gateway import Gateway
from cascade.policy.calibration import (
    CalibrationError,
    CalibrationMismatch,
    check_checkpoints,
    weight_mismatches,
    with_calibration_file,
)
from cascade.policy.files import PolicyError, load_policy
from cascade.policy.model import (
    Checkpoint,
    Checkpoints,
    ClefTier,
    LayaTier,
    Policy,
    Route,
    Tier,
    UpstreamTier,
)
from cascade.policy.novelty import check_reference, load_reference
from cascade.policy.precision import check_precision
from cascade.rollout.candidate import read_candidate, refuse_restart
from cascade.settings import Settings, env_secret
from cascade.store.base import DecisionStore

log = logging.getLogger("cascade")
# policies/default.toml (a link shipped in the package): the demo's policy too.
DEFAULT_POLICY = Path(__file__).parent / "policy" / "default.toml"
LAYA_NAMES: tuple[Checkpoint, ...] = get_args(Checkpoint)
RANDOM_BANNER = (
    "DEMO MODE: tier(s) {} serve RANDOM weights (a `cascade make-tiny` "
    "checkpoint). Answers are meaningless; this is not a model."
)
# The random-weights marker ``cascade make-tiny`` writes (cascade.laya.tiny, cascade.clef.tiny):
# in a Laya checkpoint's rl_agent_config.json, a Clef release's config.json; a Laya ONNX export
# (fp32 or int8) copies its checkpoint's into export.json.
RANDOM_MARKER = ("model_name", "cascade-tiny-random")
MARKED_FILES = ("rl_agent_config.json", "config.json", "export.json", "joint_head_config.json")
# A tiny Clef release's head config as make-tiny wrote it before the marker.
OLD_TINY_CLEF_HEAD = {
    "hidden_size": 64,
    "width": 32,
    "routing_layers": 1,
    "layers": 1,
    "heads": 2,
    "feedforward": 64,
}
DEMO_BANNER = (
    "DEMO MODE: serving TINY RANDOM checkpoints. Answers are meaningless; this is not a model. "
    "Pass --laya/--clef/--policy with real weights (convaiinnovations/laya, Cloudflare/clef-flash)."
)


class NoTiers(SystemExit):
    """No tier is configured: say how to configure one."""


def policy_from_settings(settings: Settings) -> Policy:
    """The policy the settings describe, with ``--calibration FILE`` applied when given."""
    policy = _policy(settings)
    if settings.calibration:
        policy = with_calibration_file(policy, settings.calibration)
    return policy


def _policy(settings: Settings) -> Policy:
    if settings.demo:
        return demo_policy(Path(settings.demo_dir), settings)
    if settings.policy:
        return load_policy(Path(settings.policy))
    if settings.upstream:
        tier = UpstreamTier(urls=[settings.upstream], model=settings.upstream_model)
        return Policy.single_tier("upstream", tier)
    tiers: dict[str, Tier] = {}
    if settings.laya:
        unknown = set(settings.laya) - set(LAYA_NAMES)
        if unknown:
            raise NoTiers(f"--laya names must be {', '.join(LAYA_NAMES)}; got {sorted(unknown)}")
        first = next(name for name in LAYA_NAMES if name in settings.laya)
        tiers["laya"] = LayaTier(
            checkpoints=Checkpoints.of(settings.laya),
            default_checkpoint=first,
            precision=settings.laya_precision,
        )
    if settings.clef:
        tiers["clef"] = ClefTier(
            release=settings.clef,
            max_length=settings.clef_max_length,
            overlong=settings.clef_overlong,
            device="auto",
        )
    if not tiers:
        raise NoTiers(
            "no tier configured: pass --policy FILE, --upstream URL, --laya DIR, --clef DIR, or "
            "--demo (tiny random weights). No model weights were found or given."
        )
    if len(tiers) == 1:
        name, only = next(iter(tiers.items()))
        return Policy.single_tier(name, only)
    return Policy(tiers=tiers, route=Route(cheap="laya", strong="clef"))


def demo_policy(root: Path, settings: Settings, *, write: bool = True) -> Policy:
    """The default policy (``policies/default.toml``, or ``--policy FILE``: its model table,
    pre-routing rules, thresholds and live control as they are) with its tiers' weights swapped
    for tiny random checkpoints under ``root``, Clef on the CPU, and a quarter of cheap-final
    requests shadowed so the shadow figures show up quickly. The policy must name a Laya tier
    ``laya`` and a Clef tier ``clef``, as the default one does. The Laya checkpoints are
    rewritten every time (milliseconds, and deterministic), so a demo directory an older cascade
    wrote is never served; Clef's once. ``write=False`` (a reload) writes nothing."""
    from cascade.clef.tiny import make_tiny as make_tiny_clef
    from cascade.laya.tiny import make_tiny as make_tiny_laya

    source = Path(settings.policy) if settings.policy else DEFAULT_POLICY
    policy = load_policy(source)
    laya, clef = policy.tiers.get("laya"), policy.tiers.get("clef")
    if not (isinstance(laya, LayaTier) and isinstance(clef, ClefTier)):
        raise NoTiers(
            f"--demo serves {source} on tiny checkpoints: it needs a Laya tier named "
            "`laya` and a Clef tier named `clef` ([tiers.laya], [tiers.clef])"
        )
    laya_dirs = {name: root / f"laya-{name}" for name in laya.checkpoints.named()}
    clef_dir = root / "clef-flash"
    if write:
        for seed, path in enumerate(laya_dirs.values()):
            _write_whole(path, functools.partial(make_tiny_laya, seed=seed))
        if not (clef_dir / "joint_head.safetensors").exists():
            _write_whole(clef_dir, make_tiny_clef, last="joint_head.safetensors")
    tiers: dict[str, Tier] = {
        "laya": msgspec.structs.replace(laya, checkpoints=Checkpoints.of(laya_dirs)),
        "clef": msgspec.structs.replace(clef, release=str(clef_dir), device="cpu"),
    }
    return msgspec.structs.replace(
        policy,
        description=f"demo (tiny random checkpoints): {policy.description}",
        tiers=tiers,
        shadow=msgspec.structs.replace(policy.shadow, fraction=0.25),
    )


def _write_whole(out: Path, make: Callable[[Path], object], *, last: str = "") -> None:
    """``make(dir)`` written beside ``out``, then each file renamed into ``out`` (``last``, the
    file whose presence says "written", after the others): replicas booting at once on one demo
    directory each rewrite the same bytes, and none reads a half-written file."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        make(Path(tmp))
        files = sorted(
            (p for p in Path(tmp).rglob("*") if p.is_file()), key=lambda p: p.name == last
        )
        for path in files:
            target = out / path.relative_to(tmp)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)


def resolve_laya(ref: str) -> Path:
    from cascade.laya.hub import resolve_checkpoint

    return resolve_checkpoint(ref)


def resolve_clef(ref: str, download: bool) -> Path:
    from cascade.clef.release import resolve_release

    return resolve_release(ref, allow_download=download)


def locate(tier: Tier) -> None:
    """Raise ``CheckpointError`` or ``ReleaseError`` naming a missing or incomplete checkpoint
    of an in-process tier (hub ids are fetched as ``build_engine`` would)."""
    if isinstance(tier, LayaTier):
        for ref in tier.checkpoints.named().values():
            resolve_laya(ref)
    elif isinstance(tier, ClefTier):
        resolve_clef(tier.release, tier.download)


def random_weights(path: Path | str) -> bool:
    """Whether the Laya checkpoint, Clef release or Laya ONNX export at ``path`` holds random
    weights (carries ``RANDOM_MARKER``)."""
    key, value = RANDOM_MARKER
    for name in MARKED_FILES:
        try:
            found = json.loads((Path(path) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(found, dict) and (found.get(key) == value or found == OLD_TINY_CLEF_HEAD):
            return True
    return False


def random_tiers(policy: Policy) -> list[str]:
    """The in-process tiers whose weights carry the random-weights marker (an upstream's
    weights are not visible from here): labelled DEMO as ``--demo`` is."""
    return [name for name, tier in policy.tiers.items() if is_random(tier)]


def is_random(tier: Tier) -> bool:
    if isinstance(tier, LayaTier):
        return any(random_weights(resolve_laya(ref)) for ref in tier.checkpoints.named().values())
    if isinstance(tier, ClefTier):
        return random_weights(resolve_clef(tier.release, tier.download))
    return False


def build_engine(name: str, tier: Tier, settings: Settings) -> Engine:
    demo = settings.demo or is_random(tier)
    if isinstance(tier, LayaTier):
        from cascade.engines.laya import LayaEngine

        checkpoints: dict[str, Path] = {
            n: resolve_laya(ref) for n, ref in tier.checkpoints.named().items()
        }
        return LayaEngine(
            name,
            checkpoints,
            demo=demo,
            intra_op_threads=tier.intra_op_threads,
            max_batch_rows=tier.max_batch_size,
            max_wait_s=tier.max_wait_s,
            max_queue_rows=tier.max_queue,
            default_checkpoint=tier.default_checkpoint,
            precision=tier.precision,
        )
    if isinstance(tier, ClefTier):
        from cascade.engines.clef import ClefEngine

        return ClefEngine(
            name,
            resolve_clef(tier.release, tier.download),
            device=tier.device,
            demo=demo,
            max_length=tier.max_length,
            overlong=tier.overlong,
            max_batch_requests=tier.max_batch_size,
            max_batch_tokens=tier.max_batch_tokens,
            max_queue=tier.max_queue,
            memory_budget_bytes=tier.memory_budget_bytes,
        )
    from cascade.engines.http import HttpEngine

    api_key = env_secret(tier.api_key_env) if tier.api_key_env else None
    if settings.upstream and name == "upstream":
        api_key = settings.upstream_api_key or api_key
    return HttpEngine(
        name,
        tier.urls,
        model=tier.model,
        api_key=api_key,
        connect_timeout_s=tier.connect_timeout_s,
        read_timeout_s=tier.read_timeout_s,
        health_path=tier.health_path,
        health_interval_s=tier.health_interval_s,
        max_connections=tier.max_queue,
    )


def fingerprints(policy: Policy) -> dict[str, str]:
    """Content hashes of the weights of every in-process tier, by tier name (an upstream's
    weights are not visible from here: upstream tiers are left out)."""
    found = {}
    for name, tier in policy.tiers.items():
        if isinstance(tier, LayaTier):
            hashes = {
                ck: _laya_hash(*_stamped(resolve_laya(ref)))
                for ck, ref in tier.checkpoints.named().items()
            }
            found[name] = (
                next(iter(hashes.values()))
                if len(hashes) == 1
                else hashlib.sha256(
                    "".join(f"{ck}={h}\n" for ck, h in sorted(hashes.items())).encode()
                ).hexdigest()
            )
        elif isinstance(tier, ClefTier):
            found[name] = _clef_hash(*_stamped(resolve_clef(tier.release, tier.download)))
    return found


def laya_hashes(policy: Policy) -> dict[str, dict[str, str]]:
    """Content hashes of every Laya checkpoint, by tier and checkpoint name."""
    return {
        name: {
            ck: _laya_hash(*_stamped(resolve_laya(ref)))
            for ck, ref in tier.checkpoints.named().items()
        }
        for name, tier in policy.tiers.items()
        if isinstance(tier, LayaTier)
    }


def _stamped(path: Path) -> tuple[str, tuple[tuple[str, int, int, int], ...]]:
    """``path`` and the name, size, mtime and inode of every file under it: the hashes below
    are computed once per process, and again when weights are rewritten in place."""
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return str(path), tuple(
        (str(p.relative_to(path)), (st := p.stat()).st_size, st.st_mtime_ns, st.st_ino)
        for p in files
    )


@functools.cache
def _laya_hash(path: str, stamp: tuple[tuple[str, int, int, int], ...]) -> str:
    from cascade.laya.checkpoint import content_hash

    return content_hash(Path(path))


@functools.cache
def _clef_hash(path: str, stamp: tuple[tuple[str, int, int, int], ...]) -> str:
    from cascade.clef.release import content_hash

    return content_hash(Path(path))


def located(policy: Policy) -> dict[str, str]:
    """Find every tier's files before any weights load (``locate``'s errors), then the content
    hashes of the weights the calibration is stamped with (none when it has no stamp): what
    boot and reload check before a policy serves."""
    for tier in policy.tiers.values():
        locate(tier)
    return fingerprints(policy) if policy.calibration.checkpoints else {}


def reread_policy(settings: Settings, serving: Policy) -> Policy:
    """The policy the settings' files give now, checked as at boot (the policy file's findings,
    the calibration file, its weight hashes, every tier's files found), for a reload; raises
    ``ConfigRejected`` with ``FILE[:LINE]: error: ...`` lines. A policy not read from a file
    (``--demo``, ``--upstream``, ``--laya``/``--clef``) is ``serving``, the one serving now, with
    ``--calibration`` read again when given: its tiers' definitions never change (the demo's
    checkpoints are not rewritten; ``--demo --policy FILE`` reads FILE again on them)."""
    try:
        if settings.demo and settings.policy:  # the file again, on the demo's checkpoints
            policy = demo_policy(Path(settings.demo_dir), settings, write=False)
        else:
            policy = load_policy(Path(settings.policy)) if settings.policy else serving
        if settings.calibration:
            policy = with_calibration_file(policy, settings.calibration)
    except PolicyError as exc:
        raise ConfigRejected(exc.messages) from exc
    except CalibrationError as exc:  # "FILE: what": the file's own errors carry no line
        file = str(settings.calibration)
        raise ConfigRejected([f"{file}: error: {str(exc).removeprefix(file + ': ')}"]) from exc
    return checked_files(policy, settings.policy or "<settings>")


def candidate_of(settings: Settings, policy: Policy) -> Policy | None:
    """The candidate ``policy``'s ``[rollout]`` names (None: no rollout), checked as the policy
    file is at boot and on reload (``cascade.rollout.candidate``, ``checked_files``); under
    ``--demo`` it decides on the demo's tiers. Raises ``ConfigRejected`` (``RestartNeeded``)."""
    if policy.rollout is None:
        return None
    path = policy.rollout.candidate
    candidate = read_candidate(path)
    if settings.demo:
        shadow = msgspec.structs.replace(candidate.shadow, fraction=policy.shadow.fraction)
        candidate = msgspec.structs.replace(candidate, tiers=policy.tiers, shadow=shadow)
    refuse_restart(policy, candidate, path)
    return checked_files(candidate, path)


def checked_files(policy: Policy, source: str) -> Policy:
    """``policy``, once every tier's files are found and its calibration fits their weights
    (``ConfigRejected`` lines otherwise, a missing file's naming ``source``)."""
    try:
        found = located(policy)
    except (ValueError, CascadeError) as exc:  # CheckpointError, ReleaseError: a missing file
        raise ConfigRejected([f"{source}: error: {exc}"]) from exc
    wrong = weight_mismatches(policy, found)
    if wrong:
        file = policy.calibration.file or "<calibration>"
        raise ConfigRejected(
            [
                f"{file}: error: {line}; refit it with `cascade calibrate` for these weights"
                for line in wrong
            ]
        )
    try:
        check_reference(policy, load_reference(policy), found)
    except (CalibrationError, CalibrationMismatch) as exc:
        raise ConfigRejected([f"{policy.calibration.file}: error: {exc}"]) from exc
    return policy


def tier_ids(policy: Policy) -> dict[str, str]:
    """Each tier's content id for the decision cache: its weights' hash, or for an upstream
    (whose weights are not visible from here) its URLs and forwarded model."""
    found = fingerprints(policy)
    for name, tier in policy.tiers.items():
        if isinstance(tier, UpstreamTier):
            found[name] = msgspec.json.encode(["upstream", tier.urls, tier.model]).decode()
    return found


def build_gateway(
    settings: Settings, *, policy: Policy | None = None, decisions: DecisionStore | None = None
) -> Gateway:
    """The gateway of ``settings`` (its ``policy``, when already read), logging to
    ``decisions``. Raises ``CalibrationMismatch`` (exits, naming both hashes) when the policy's
    calibration was fitted for other weights, ``FlipGateRefused`` when an int8 Laya tier has no
    passing flip report for its weights. Random weights (``random_tiers``) are labelled DEMO
    as ``--demo`` is: the log, ``/health``, metrics, every answer's model and header."""
    policy = policy or policy_from_settings(settings)
    if settings.demo:
        log.warning(DEMO_BANNER)
    found = located(policy)
    check_checkpoints(policy, found)
    check_reference(policy, load_reference(policy), found)
    random = random_tiers(policy)
    if random and not settings.demo:
        log.warning(RANDOM_BANNER.format(", ".join(random)))
    check_precision(policy, resolve_laya, laya_hashes(policy))
    engines = {name: build_engine(name, tier, settings) for name, tier in policy.tiers.items()}
    cache = build_cache(policy.cache, tier_ids=tier_ids)
    if cache is not None:
        cache.version(policy)  # the weights are hashed now, not on the first request
    return Gateway(
        policy,
        engines,
        profile=settings.profile,
        demo=settings.demo or bool(random),
        admission_deadline_s=settings.admission_deadline_s,
        decisions=decisions,
        cache=cache,
        weights=None if decisions is None else fingerprints(policy),
    )
