"""``cascade distill`` on the demo tiers: the student learns the teacher on held-back requests,
NEWDIR is a standard Laya checkpoint, a run that cannot improve is refused, runs are
deterministic and resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from cascade.clef.release import content_hash as clef_hash
from cascade.laya.checkpoint import content_hash, read_header
from cascade.learn import train
from cascade.learn.source import data_hash, read_requests
from tests.learn.conftest import REQUESTS, Run, distill, report_of


def files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_distilling_raises_held_back_agreement(
    distilled: Run, demo_dir: Path, requests_file: Path
) -> None:
    assert distilled.code == 0, distilled.stderr
    report = report_of(distilled)
    before, after = report.before, report.after
    assert after.agreement >= before.agreement + 0.3, (before, after)
    assert after.mean_kl < before.mean_kl / 2
    assert before.questions == after.questions >= 30
    assert f"{after.agreement:.1%}" in distilled.stdout
    assert f"wrote {distilled.out}" in distilled.stdout
    meta = json.loads((distilled.out / "distill.json").read_text())
    assert meta == report.meta
    assert meta["source"]["content_hash"] == content_hash(demo_dir / "laya-english")
    assert meta["teacher"] == {
        "tier": "clef",
        "kind": "clef",
        "identity": clef_hash(demo_dir / "clef-flash"),
        "release": str((demo_dir / "clef-flash").resolve()),
    }
    items, _ = read_requests(requests_file)
    assert meta["data"]["items"] == REQUESTS
    assert meta["data"]["hash"] == data_hash(items)
    assert meta["data"]["train_rows"] > 3 * meta["data"]["held_back_rows"] > 0


def test_newdir_is_a_standard_laya_checkpoint(distilled: Run, demo_dir: Path) -> None:
    source, new = demo_dir / "laya-english", distilled.out
    assert files(new) == files(source) | {"distill.json"}
    for name in files(source) - {"model.safetensors"}:
        assert (new / name).read_bytes() == (source / name).read_bytes(), name
    (old_header, _), (new_header, _) = (read_header(d / "model.safetensors") for d in (source, new))
    assert {k: (v["dtype"], v["shape"]) for k, v in new_header.items()} == {
        k: (v["dtype"], v["shape"]) for k, v in old_header.items()
    }
    with (
        safe_open(str(source / "model.safetensors"), "pt") as a,
        safe_open(str(new / "model.safetensors"), "pt") as b,
    ):
        assert b.metadata() == a.metadata()
        changed = [k for k in a.keys() if not a.get_tensor(k).equal(b.get_tensor(k))]
    assert "scorer.3.weight" in changed and "encoder.layers.0.attn.Wqkv.weight" in changed


def test_a_run_that_cannot_improve_is_refused(
    distilled: Run, demo_dir: Path, requests_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "never"
    # the teacher's answers are cached in the run directory: only training is redone
    run = distill(
        demo_dir,
        requests_file,
        "--demo",
        "--out",
        out,
        "--run-dir",
        distilled.run_dir,
        "--epochs",
        "0",
    )
    assert run.code == 1
    assert "refused: held-back agreement with the teacher did not improve" in run.stderr
    assert not out.exists()
    again = distill(
        demo_dir, requests_file, "--demo", "--out", distilled.out, "--run-dir", distilled.run_dir
    )
    assert again.code == 2 and "exists" in again.stderr


def test_same_seed_same_checkpoint_even_after_an_interruption(
    distilled: Run,
    demo_dir: Path,
    requests_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = {}
    for name in ("straight", "interrupted"):
        (tmp_path / name).mkdir()
        shutil.copy(distilled.run_dir / "teacher.jsonl", tmp_path / name)
    args = ("--demo", "--epochs", "2", "--seed", "3")
    runs["straight"] = distill(
        demo_dir, requests_file, *args, "--out", tmp_path / "a", "--run-dir", tmp_path / "straight"
    )
    save = train._save

    def save_then_stop(path: Path, state: dict) -> None:
        save(path, state)
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(train, "_save", save_then_stop)
        with pytest.raises(KeyboardInterrupt):
            distill(
                demo_dir,
                requests_file,
                *args,
                "--out",
                tmp_path / "b",
                "--run-dir",
                tmp_path / "interrupted",
            )
    assert not (tmp_path / "b").exists()
    runs["interrupted"] = distill(
        demo_dir,
        requests_file,
        *args,
        "--out",
        tmp_path / "b",
        "--run-dir",
        tmp_path / "interrupted",
    )
    assert all(r.code == 0 for r in runs.values())
    a, b = (report_of(r) for r in runs.values())
    assert a.meta["training"]["epoch_losses"] == b.meta["training"]["epoch_losses"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model.safetensors"
    ).read_bytes()
