"""One ``cascade distill`` run, start to finish; the CLI only parses flags and prints.

Steps: the policy (a file, or the demo's) names the teacher (its strong tier) and the student
(its cheap tier's default Laya checkpoint, or ``--laya``) -> read the source -> the teacher
answers what it has not answered yet (cached in the run directory) -> examples from the
engine's own rows, split by item -> held-back figures before -> train (resumable) -> round the
weights to the source's dtypes -> held-back figures after -> refuse unless agreement improved,
else write NEWDIR. The run directory defaults to ``$CASCADE_CACHE/distill/<key>``, the key
hashing the student checkpoint, the teacher and the data, so re-running a command resumes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import torch

from cascade import __version__
from cascade.answers import demo_label
from cascade.build import (
    build_engine,
    is_random,
    policy_from_settings,
    random_weights,
    resolve_laya,
)
from cascade.eval.data import Item
from cascade.eval.tiers import identity, identity_of
from cascade.laya.checkpoint import content_hash
from cascade.laya.export import cache_root
from cascade.laya.preview import Previewer
from cascade.learn import dataset, teacher
from cascade.learn.figures import Figures, figures, predict
from cascade.learn.source import data_hash, read_requests
from cascade.learn.student import Student, cpu_threads, device_for
from cascade.learn.train import TrainConfig, train
from cascade.learn.write import META_FILE, refuse_existing, write_checkpoint
from cascade.policy.model import Checkpoints, ClefTier, LayaTier, Policy, UpstreamTier
from cascade.settings import Settings


class DistillError(RuntimeError):
    """A run that cannot start or must not write NEWDIR; the message says why."""


class DistillOptions(msgspec.Struct, kw_only=True):
    source: Path | None = None  # a request file
    from_log: list[str | Path] = []  # decision logs (rows the strong tier answered): files, URLs
    log_filters: dict[str, Any] = {}  # read_rows' since and tenant
    settings: Settings  # policy or demo, as ``cascade serve`` reads them
    laya: str | None = None  # the student checkpoint, instead of the policy's default
    out: Path
    run_dir: Path | None = None
    held_back: float = 0.2
    device: str = "auto"
    threads: int | None = None  # torch CPU threads; None: ``cpu_threads`` of the student
    config: TrainConfig = msgspec.field(default_factory=TrainConfig)
    progress: bool = True


class Report(msgspec.Struct, kw_only=True):
    written: bool
    out: Path
    run_dir: Path
    meta: dict[str, Any]  # what distill.json holds (also written to the run directory)

    @property
    def before(self) -> Figures:
        return msgspec.convert(self.meta["held_back"]["before"], Figures)

    @property
    def after(self) -> Figures:
        return msgspec.convert(self.meta["held_back"]["after"], Figures)


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def student_of(policy: Policy, laya: str | None) -> tuple[str, Path]:
    """The checkpoint name the policy serves the student under, and its directory."""
    tier = policy.cheap_tier()
    if not isinstance(tier, LayaTier):
        if laya is None:
            raise DistillError("the policy's cheap tier is not Laya: pass --laya DIR")
        return "english", resolve_laya(laya)
    name = tier.default_checkpoint
    ref = laya or tier.checkpoints.named().get(name)
    if ref is None:
        raise DistillError(f"the policy's Laya tier has no {name!r} checkpoint: pass --laya DIR")
    return name, resolve_laya(ref)


def teacher_identity(policy: Policy) -> dict[str, Any]:
    """What names the teacher in distill.json and the run directory's key: where it is and,
    for Clef, its ``identity`` (the content hash of the release's files, so a release retrained
    in place is a new teacher; an upstream's, with what it reports, keys its cached answers)."""
    name = policy.route.strong
    tier = policy.tiers.get(name or "")
    if isinstance(tier, ClefTier):
        where = Path(tier.release).expanduser()
        return {
            "tier": name,
            "kind": "clef",
            "identity": identity(name or "", tier),
            "release": str(where.resolve()) if where.exists() else tier.release,
        }
    if isinstance(tier, UpstreamTier):
        return {"tier": name, "kind": "upstream", "urls": tier.urls, "model": tier.model}
    raise DistillError("the policy has no strong tier (clef or upstream) to learn from")


def cascade_model(policy: Policy) -> str:
    """A request ``model`` the policy routes through the cascade."""
    return policy.models.cascade[0] if policy.models.cascade else "cascade"


def _teach(options: DistillOptions, policy: Policy, items: list[Item], run_dir: Path) -> list[Item]:
    name = policy.route.strong
    assert name is not None
    tier = policy.tiers[name]
    engine = build_engine(name, tier, options.settings)
    model = (policy.models.strong_only or [cascade_model(policy)])[0]
    cache = teacher.open_cache(run_dir)

    async def teach() -> str:
        known = await identity_of(name, tier, engine)  # an upstream says what it serves
        await teacher.ask(
            engine, items, cache, identity=known, model=model, progress=options.progress
        )
        return known

    try:
        known = asyncio.run(teach())
    finally:
        cache.close()
    return teacher.attach(items, cache, identity=known)


def _read(
    options: DistillOptions, policy: Policy
) -> tuple[list[Item], dict[str, Any], dict[str, Any]]:
    """The items, what was left out of them, and the teacher's identity."""
    if options.from_log:
        from cascade.learn.logs import read_log

        return read_log(options.from_log, **options.log_filters)
    if options.source is None:
        raise DistillError("give a request file or --from-log FILE")
    items, left_out = read_requests(options.source)
    return items, left_out, teacher_identity(policy)


def routing_view(policy: Policy, name: str, student: Path) -> Policy:
    """The policy with the student as its cheap tier's only checkpoint (for ``figures``)."""
    tier = policy.cheap_tier()
    if not isinstance(tier, LayaTier) or policy.route.cheap is None:
        return policy
    tier = msgspec.structs.replace(
        tier, checkpoints=Checkpoints.of({name: student}), default_checkpoint=name
    )
    return msgspec.structs.replace(policy, tiers={**policy.tiers, policy.route.cheap: tier})


def random_roles(options: DistillOptions, policy: Policy, student: Path) -> list[str]:
    """Which of the student and the teacher (a tier run here, not a log) are random weights."""
    strong = policy.route.strong
    teacher_random = not options.from_log and strong is not None and is_random(policy.tiers[strong])
    return [
        role
        for role, random in (("student", random_weights(student)), ("teacher", teacher_random))
        if random
    ]


def run(options: DistillOptions) -> Report:
    """Distil; the report says whether NEWDIR was written (``DistillError`` when it cannot
    start)."""
    refuse_existing(options.out)
    policy = policy_from_settings(options.settings)
    name, source = student_of(policy, options.laya)
    items, left_out, about_teacher = _read(options, policy)
    previewer = Previewer({name: source}, default=name)
    source_hash, data = content_hash(source), data_hash(items)
    run_dir = (
        options.run_dir
        or cache_root().parent / "distill" / _key(source_hash, about_teacher, data)[:16]
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    taught = items if options.from_log else _teach(options, policy, items, run_dir)
    taught_s = time.perf_counter() - started
    if len(taught) < len(items):
        left_out["teacher_refused"] = len(items) - len(taught)
    examples = dataset.build(previewer, name, taught, options.held_back)
    if not examples.train or not examples.held_back:
        raise DistillError(
            f"not enough data: {len(examples.train)} training and {len(examples.held_back)} "
            f"held-back questions the student can read (skipped: {examples.skipped}); give "
            "more requests"
        )
    device = device_for(options.device)
    if device.type == "cpu":  # after the teacher, which keeps its engine's own threads
        torch.set_num_threads(
            options.threads or cpu_threads(previewer.checkpoints[name].cfg.encoder.hidden)
        )
    student = Student(
        source, previewer.checkpoints[name].tok.pad_id, device=device, train=options.config.train
    )
    view, model = routing_view(policy, name, source), cascade_model(policy)
    by_key = {item.key: item for item in taught}

    def held_back_figures() -> Figures:
        probs = predict(student, examples.held_back)
        return figures(examples.held_back, probs, view, name, by_key, model)

    before = held_back_figures()
    state = run_dir / f"train-{_key(options.config, options.held_back, str(device))[:12]}.pt"
    started = time.perf_counter()
    losses = train(student, examples.train, options.config, state, progress=options.progress)
    trained_s = time.perf_counter() - started
    student.round_to_source()
    after = held_back_figures()
    meta = {
        "format": "cascade-distill/1",
        "cascade_version": __version__,
        **demo_label(random_roles(options, policy, source)),
        "source": {"path": str(source), "content_hash": source_hash, "checkpoint": name},
        "teacher": about_teacher,
        "data": {
            "source": [str(p) for p in options.from_log] or str(options.source),
            "kind": "log" if options.from_log else "requests",
            "items": len(items),
            "hash": data,
            "left_out": left_out,
            "held_back_fraction": options.held_back,
            **examples.describe(),
        },
        "training": {
            **msgspec.to_builtins(options.config),
            "device": str(device),
            "epoch_losses": losses,
            "teacher_s": round(taught_s, 3),
            "train_s": round(trained_s, 3),
        },
        "held_back": {"before": msgspec.to_builtins(before), "after": msgspec.to_builtins(after)},
    }
    (run_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    written = after.agreement > before.agreement
    if written:
        write_checkpoint(source, options.out, student.state(as_source=True), meta)
    return Report(written=written, out=options.out, run_dir=run_dir, meta=meta)
