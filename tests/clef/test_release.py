"""Locating and verifying releases; the tiny release format; the CLI commands."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from cascade.clef import release
from cascade.clef.release import ReleaseError
from cascade.cli import main


def copy_release(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_locate_refuses_incomplete_directories(tiny_release, tmp_path):
    broken = copy_release(tiny_release, tmp_path / "broken")
    (broken / "joint_head.safetensors").unlink()
    with pytest.raises(ReleaseError, match="missing joint_head.safetensors"):
        release.resolve_release(broken)


def test_locate_never_downloads(monkeypatch, tmp_path):
    def no_network(*args, **kwargs):
        raise AssertionError("network access")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(ReleaseError, match="local hub cache"):
        release.resolve_release("Cloudflare/clef-flash", cache_dir=tmp_path / "hub")


def test_locate_finds_a_hub_cache_snapshot(tiny_release, tmp_path):
    snapshot = tmp_path / "hub" / "models--Cloudflare--clef-flash" / "snapshots" / ("a" * 40)
    copy_release(tiny_release, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("a" * 40)
    assert release.resolve_release("Cloudflare/clef-flash", cache_dir=tmp_path / "hub") == snapshot


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop("field_norm.bias"), "missing field_norm.bias"),
        (lambda t: t.update(extra=torch.zeros(1)), "unexpected extra"),
        (
            lambda t: t.update({"type_embedding.weight": torch.zeros(4, 32)}),
            r"type_embedding.weight has shape \[4, 32\], expected \[3, 32\]",
        ),
    ],
)
def test_mismatched_head_tensors_are_named(tiny_release, tmp_path, edit, message):
    bad = copy_release(tiny_release, tmp_path / "bad")
    tensors = load_file(bad / "joint_head.safetensors")
    edit(tensors)
    save_file(tensors, str(bad / "joint_head.safetensors"))
    with pytest.raises(ReleaseError, match=message):
        release.load_head(bad, 64)


def test_head_hidden_size_must_match_the_backbone(tiny_release):
    with pytest.raises(ReleaseError, match="hidden_size 64; the backbone has 128"):
        release.load_head(tiny_release, 128)


def test_loaded_release_is_fp32_on_cpu(loaded):
    assert loaded.dtype == torch.float32 and loaded.device.type == "cpu"
    assert next(loaded.backbone.parameters()).dtype == torch.float32
    assert loaded.head.hidden_norm.weight.dtype == torch.float32


def test_tiny_release_is_real_and_discriminating(tiny_release):
    from transformers import Qwen3_5Config

    config = Qwen3_5Config.from_pretrained(tiny_release)
    assert config.model_type == "qwen3_5" and config.text_config.hidden_size == 64
    assert config.vision_config.out_hidden_size == config.text_config.hidden_size
    tokenizer_config = json.loads((tiny_release / "tokenizer_config.json").read_text())
    assert tokenizer_config["pad_token"] == "<|endoftext|>"
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    for name in (
        "preprocessor_config.json",
        "video_preprocessor_config.json",
        "tokenizer.json",
        "model.safetensors",
    ):
        assert (tiny_release / name).is_file()
    head = load_file(tiny_release / "joint_head.safetensors")
    assert head["residual_gate"].item() != 0 and head["joint_logit_scale"].item() != 0
    assert head["hidden_norm.weight"].mean().item() == pytest.approx(1.0, abs=0.05)
    assert head["memory_projection.weight"].std().item() == pytest.approx(0.1, abs=0.01)


def test_make_tiny_cli_is_deterministic(tmp_path, capsys):
    assert main(["make-tiny", "clef", str(tmp_path / "a"), "--seed", "3"]) == 0
    assert main(["make-tiny", "clef", str(tmp_path / "b"), "--seed", "3"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "a"), str(tmp_path / "b")]
    a, b = (load_file(tmp_path / d / "joint_head.safetensors") for d in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bench_cli_on_the_cpu(tiny_release, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert (
        main(
            [
                "bench",
                "clef",
                "--shape",
                "tiny",
                "--release",
                str(tiny_release),
                "--device",
                "cpu",
                "--tokens",
                "64,256",
                "--repeats",
                "2",
                "--concurrency",
                "2",
                "--requests",
                "4",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert "throughput, 2 concurrent" in printed
    assert [row["target_tokens"] for row in result["latency"]] == [64, 256]
    assert result["latency"][1]["input_tokens"] > result["latency"][0]["input_tokens"]
    assert result["throughput"]["ours_rps"] > 0 and result["throughput"]["reference_rps"] > 0


def test_bench_cli_refuses_the_9b_shape_without_cuda(capsys):
    assert main(["bench", "clef", "--shape", "9b", "--device", "cpu"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_bench_random_bf16_path_runs_with_a_mini_shape(monkeypatch):
    """The 9b code path (random bf16 weights built in place), at the tiny geometry on CPU."""
    from cascade.bench import clef as bench
    from cascade.clef import tiny

    text = {**tiny.TEXT, "rope_parameters": bench.FLASH_TEXT["rope_parameters"]}
    monkeypatch.setitem(bench.SHAPES, "mini", (text, tiny.VISION, tiny.HEAD))
    result = bench.run("mini", device="cpu", tokens=(64,), repeats=1, concurrency=2, requests=2)
    assert result["dtype"] == "bfloat16"
    assert result["latency"][0]["ours"]["p50_ms"] > 0
    assert "throughput, 2 concurrent" in bench.table(result)


def test_flash_geometry_has_the_published_size():
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from cascade.bench import clef as bench
    from cascade.clef.head import JointSchemaHead

    config = Qwen3_5Config(text_config=bench.FLASH_TEXT, vision_config=bench.FLASH_VISION)
    with torch.device("meta"):
        backbone = Qwen3_5ForConditionalGeneration(config)
        head = JointSchemaHead(**bench.FLASH_HEAD)
    assert sum(p.numel() for p in head.parameters()) == 121_762_820
    assert 9.0e9 < sum(p.numel() for p in backbone.parameters()) < 9.8e9


def test_clef_bench_runs_without_the_gateway_cli(capsys):
    """``python -m cascade.cli.bench clef`` is what a GPU host without litestar runs."""
    from cascade.cli.bench import main as bench_main

    assert bench_main(["clef", "--shape", "9b", "--device", "cpu"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
