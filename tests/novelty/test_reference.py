"""Reference sets on the tiny checkpoint's own pooled vectors: familiar rows flagged at about the
configured rate, rows of another distribution flagged; the file round-trips and is hash-checked."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from cascade.calls import EngineCall
from cascade.engines.onnx import OnnxSession
from cascade.laya import decode
from cascade.laya.export import MODEL_FILE, export
from cascade.laya.preview import Previewer
from cascade.laya.rows import collate
from cascade.laya.tiny import make_tiny
from cascade.novelty.reference import (
    ReferenceError,
    ReferenceSet,
    cell_of,
    fit,
    knn,
    load,
    save,
)
from cascade.schema import NoulQuestion

FAMILIAR = ["refund", "crash", "price", "login", "invoice", "contract"]
FOREIGN = [
    "the",
    "weather",
    "in",
    "lisbon",
    "will",
    "be",
    "sunny",
    "with",
    "light",
    "winds",
    "harvest",
    "tractor",
    "wheat",
    "sonata",
    "violin",
    "glacier",
]
CELL = cell_of("english", "noul", "2")
RATE = 0.05


def _states(n: int, foreign: bool, seed: int) -> list[str]:
    rng = random.Random(seed)
    if foreign:
        return [" ".join(rng.choice(FOREIGN) for _ in range(rng.randint(40, 80))) for _ in range(n)]
    return [f"ticket {i}: " + " ".join(rng.choice(FAMILIAR) for _ in range(6)) for i in range(n)]


@pytest.fixture(scope="module")
def vectors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[bytes]]:
    """The tiny checkpoint's vectors (through the engine's decode) for familiar and foreign
    states, one noul question each."""
    root = tmp_path_factory.mktemp("novelty")
    ckpt = make_tiny(root / "laya", seed=0)
    session = OnnxSession(
        export(ckpt, cache=root / "onnx", progress=lambda _: None) / MODEL_FILE,
        intra_op_threads=1,
        optional=("pooled",),
    )
    previewer = Previewer({"english": ckpt})
    tiny = previewer.checkpoints["english"]
    out: dict[str, list[bytes]] = {}
    for name, states in (
        ("fit", _states(300, False, 1)),
        ("familiar", _states(200, False, 2)),
        ("foreign", _states(100, True, 3)),
    ):
        out[name] = []
        for state in states:
            plan = previewer.plan(
                EngineCall(
                    state=state,
                    model="english",
                    questions={"q": NoulQuestion(instructions="Urgent?")},
                )
            )
            logits, act, pooled = session.run(collate(plan.rows, tiny.tok.pad_id))
            rows = [(logits[0, : len(plan.rows[0].markers)], act[0], pooled[0])]
            result = decode.results(plan.questions, plan.rows, rows, tiny.cfg)["q"]
            assert result.vector is not None
            out[name].append(result.vector)
    return out


def _fitted(vectors: dict[str, list[bytes]]) -> ReferenceSet:
    return fit(
        {CELL: vectors["fit"]},
        weights="w1",
        k=5,
        dims=16,
        max_reference=250,
        max_flag_rate=RATE,
        min_rows=30,
    )


def _flag_rate(ref: ReferenceSet, rows: list[bytes]) -> float:
    return float(np.mean([(ref.novelty(CELL, v) or 0.0) > ref.thresholds[CELL] for v in rows]))


def test_familiar_rows_flag_at_about_the_rate_and_foreign_rows_flag(
    vectors: dict[str, list[bytes]],
) -> None:
    ref = _fitted(vectors)
    assert ref.cells[CELL].shape == (250, 16)  # bounded and compressed
    own = knn(ref.cells[CELL], ref.cells[CELL], 5, leave_out_self=True)
    assert np.mean(own > ref.thresholds[CELL]) <= RATE  # the fit's own rate
    assert _flag_rate(ref, vectors["familiar"]) <= 3 * RATE  # held out: about the rate
    assert _flag_rate(ref, vectors["foreign"]) >= 0.9


def test_a_cell_with_too_few_rows_gets_no_reference(vectors: dict[str, list[bytes]]) -> None:
    ref = fit(
        {CELL: vectors["fit"][:20]},
        weights="w1",
        k=5,
        dims=16,
        max_reference=250,
        max_flag_rate=RATE,
        min_rows=30,
    )
    assert ref.cells == {} and ref.novelty(CELL, vectors["fit"][0]) is None


def test_the_file_round_trips_and_is_checked_against_its_hash(
    vectors: dict[str, list[bytes]], tmp_path: Path
) -> None:
    ref = _fitted(vectors)
    digest = save(tmp_path / "r.npz", ref)
    back = load(tmp_path / "r.npz", digest)
    assert back.weights == "w1" and back.thresholds == ref.thresholds and back.k == 5
    assert np.array_equal(back.cells[CELL], ref.cells[CELL])
    assert back.novelty(CELL, vectors["foreign"][0]) == ref.novelty(CELL, vectors["foreign"][0])
    with pytest.raises(ReferenceError, match="names reference set 00"):
        load(tmp_path / "r.npz", "00" * 32)
    (tmp_path / "bad.npz").write_bytes(b"not an npz")
    with pytest.raises(ReferenceError, match="not a novelty reference set"):
        load(tmp_path / "bad.npz")
