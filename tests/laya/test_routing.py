"""Script detection, checkpoint choice and preview, hub resolution, the CLI commands."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from cascade.calls import EngineCall
from cascade.cli import main
from cascade.errors import UnknownModel
from cascade.laya.config import CheckpointError
from cascade.laya.hub import resolve_checkpoint
from cascade.laya.preview import Previewer
from cascade.laya.script import dominant_script
from cascade.schema import Controls, Question


@pytest.mark.parametrize(
    ("state", "script", "multilingual"),
    [
        ("Where is my refund?", "latin", False),
        ("Где мой возврат? Заказ не пришёл.", "cyrillic", True),
        ("我的退款在哪里", "han", True),
        ("أين استرداد أموالي", "arabic", True),
        ("12345 !!! ???", "unknown", False),
        ({"Где": "my refund please, it has been weeks"}, "latin", False),  # dict keys ignored
        ("Refund for my order please, Спасибо", "latin", True),  # 20 %+ Cyrillic
        (["hello", {"content": "こんにちは、返金はどこですか"}], "kana", True),
    ],
)
def test_dominant_script(state: object, script: str, multilingual: bool) -> None:
    assert dominant_script(state) == (script, multilingual)


def make_call(state: object, model: str = "jev-latest", **controls: object) -> EngineCall:
    # Budgets tighter than the tiny checkpoint's (512, 192): 30 options collapse in 48 tokens.
    controls.setdefault("max_len", 200)
    controls.setdefault("head_max_len", 48)
    questions = {
        "q": {"type": "noul", "instructions": "Is it late?"},
        "c": {
            "type": "choice",
            "instructions": "Which?",
            "criteria": [f"option_{i}" for i in range(30)],
        },
    }
    return EngineCall(
        state=state,
        questions=msgspec.convert(questions, dict[str, Question]),
        model=model,
        controls=Controls(**controls),
    )  # type: ignore[arg-type]


def test_previewer_chooses_and_previews(tiny_dirs: dict[str, Path]) -> None:
    both = Previewer({"english": tiny_dirs["v5"], "multilingual": tiny_dirs["v4"]})
    assert both.preview(make_call("late again")).checkpoint == "english"
    ru = both.preview(make_call("Опять опоздание"))
    assert (ru.checkpoint, ru.script, ru.readable) == ("multilingual", "cyrillic", True)
    forced = both.preview(make_call("Опять опоздание", model="laya"))
    assert (forced.checkpoint, forced.readable) == ("english", False)
    assert both.preview(make_call("x", task="typed_decisions")).checkpoint == "english"
    assert both.preview(make_call("x", lang="fr-CA")).checkpoint == "multilingual"
    with pytest.raises(UnknownModel):
        both.preview(make_call("x"), checkpoint="typed-decisions")
    english_only = Previewer({"english": tiny_dirs["v5"]})
    assert english_only.preview(make_call("Опять", model="multi")).checkpoint == "english"


def test_preview_rows(tiny_dirs: dict[str, Path]) -> None:
    preview = Previewer({"english": tiny_dirs["v5"]}).preview(make_call("late " * 300))
    q, c = preview.rows["q"], preview.rows["c"]
    assert q.n_options == 2 and c.n_options == 30
    assert q.state_tokens == c.state_tokens and q.state_tokens_dropped < c.state_tokens_dropped
    assert q.row_tokens == c.row_tokens == 200 and c.collapsed and not q.collapsed


def test_hub_resolution(
    tiny_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_checkpoint(str(tiny_dirs["v5"])) == tiny_dirs["v5"]
    with pytest.raises(CheckpointError, match="not a Laya checkpoint"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="neither a checkpoint directory"):
        resolve_checkpoint("no-such-thing")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(CheckpointError, match="'multilingual' is not in the local hub cache"):
        resolve_checkpoint("convaiinnovations/laya/multilingual", offline=True)


def test_make_tiny_and_export_commands(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert (
        main(["make-tiny", "laya", str(tmp_path / "t"), "--config-format", "v4", "--seed", "7"])
        == 0
    )
    config = json.loads((tmp_path / "t" / "encoder" / "config.json").read_text())
    assert config["global_rope_theta"] == 40000.0 and "rope_parameters" not in config
    assert "RANDOM" in capsys.readouterr().out
    assert main(["export", "laya", str(tmp_path / "t"), "--out", str(tmp_path / "o")]) == 0
    meta = json.loads((tmp_path / "o" / "export.json").read_text())
    assert meta["self_check"]["logits"] <= 1e-3
    assert (tmp_path / "o" / "model.onnx.data").stat().st_size > 500_000
    assert (
        main(
            [
                "export",
                "laya",
                str(tmp_path / "t"),
                "--precision",
                "int8",
                "--out",
                str(tmp_path / "o8"),
            ]
        )
        == 0
    )
    assert (tmp_path / "o8" / "model.onnx").exists()
    assert "no flip check run" in capsys.readouterr().out


def test_export_refuses_to_overwrite_a_foreign_directory(
    tiny_dirs: dict[str, Path], tmp_path: Path
) -> None:
    from cascade.laya.export import export

    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a cascade export"):
        export(tiny_dirs["v5"], tmp_path)
    assert (tmp_path / "precious.txt").exists()
