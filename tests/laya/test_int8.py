"""The int8 export (recipe, cache key), the flip check's report, and the gateway's flip gate."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import msgspec
import onnx
import pytest

from cascade.build import DEFAULT_POLICY, build_gateway
from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.cli import main
from cascade.eval.data import Item
from cascade.eval.flips import compare
from cascade.laya import int8
from cascade.laya.checkpoint import content_hash
from cascade.laya.export import MODEL_FILE, cached_export
from cascade.laya.flip_report import read_report, write_report
from cascade.laya.int8 import REPORT_FILE, cached_int8, export_int8, int8_key, model_hash
from cascade.laya.tiny import make_tiny
from cascade.policy.files import load_policy
from cascade.policy.precision import FlipGateRefused
from cascade.schema import Question
from cascade.settings import Settings

REQUESTS = [
    {
        "id": f"r{i}",
        "state": f"Customer {i}: my parcel {'arrived broken' if i % 2 else 'is late'}.",
        "questions": {
            "dept": {
                "type": "choice",
                "instructions": "Which department?",
                "criteria": {"billing": "money", "tech": "bugs", "account": "login"},
            },
            "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        },
        "gold": {"dept": "billing", "urgent": bool(i % 2)},
    }
    for i in range(6)
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("int8-cache")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("int8-ckpt") / "english", seed=5)


@pytest.fixture(scope="module")
def checked(ckpt: Path, cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cascade export laya CKPT --precision int8 --check DATA``; the int8 export's dir."""
    import torch

    torch.set_num_threads(1)
    data = tmp_path_factory.mktemp("int8-data") / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CASCADE_CACHE", str(cache))
        assert (
            main(
                [
                    "export",
                    "laya",
                    str(ckpt),
                    "--precision",
                    "int8",
                    "--check",
                    str(data),
                    "--max-flip-rate",
                    "1",
                    "--clients",
                    "2",
                ]
            )
            == 0
        )
    found = cached_int8(ckpt, cache / "laya-onnx")
    assert found is not None
    return found


def _kinds(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str]]:
    return int8.gemm_kinds(model, layers=3, head_layers=2)  # the tiny checkpoint's


def test_only_the_gemms_over_every_token_are_int8(ckpt: Path, checked: Path, cache: Path) -> None:
    fp32 = onnx.load(str(cached_export(ckpt, cache / "laya-onnx") / MODEL_FILE))
    quant = onnx.load(str(checked / MODEL_FILE))
    before, after = (Counter(n.op_type for n in m.graph.node) for m in (fp32, quant))
    kinds = [kind for _, kind in _kinds(fp32)]
    assert len(kinds) == before["MatMul"] - 2 * 3 - 2 * 2  # attention's two per layer: fp32
    chosen = [kind for _, kind in int8.int8_gemms(fp32, 3, 2)]
    # the encoder's four per layer, the first head layer's four, the last one's key/value
    assert chosen == [*int8.GEMM_KINDS * 3, *int8.HEAD_KINDS, "head.last.kv"]
    assert after["MatMulInteger"] == len(chosen) == 4 * 3 + 5
    assert after["MatMul"] == before["MatMul"] - len(chosen)  # read positions, scorer: fp32
    for op in ("LayerNormalization", "Softmax", "Cos", "Sin", "Gelu", "Relu"):
        assert after[op] == before[op]
    scales = [i for i in quant.graph.initializer if i.name.endswith("_scale")]
    assert scales and all(len(i.dims) == 1 and i.dims[0] > 1 for i in scales)  # per channel


def test_a_graph_with_other_gemms_is_refused(ckpt: Path, checked: Path, cache: Path) -> None:
    fp32 = onnx.load(str(cached_export(ckpt, cache / "laya-onnx") / MODEL_FILE))
    with pytest.raises(RuntimeError, match="found 25 weight GEMMs, expected 29"):
        int8.gemm_kinds(fp32, layers=4, head_layers=2)


def test_only_the_ffn_output_inputs_are_row_scaled(checked: Path) -> None:
    """The input each int8 GEMM quantizes is the layer's activation itself, except the FFNs'
    second GEMM's (``mlp.Wo``: GELU(inp) x gate; the head's ``linear2``: ReLU(...)), first
    divided by its per-row max |x|."""
    quant = onnx.load(str(checked / MODEL_FILE))
    made = {out: node for node in quant.graph.node for out in node.output}
    used = Counter(i for node in quant.graph.node for i in node.input)
    quantized = [
        made[node.input[0]] for node in quant.graph.node if node.op_type == "DynamicQuantizeLinear"
    ]
    assert len(quantized) == 4 * 3 + 5  # one per int8 GEMM
    assert int8.RECIPE["row_scaled"] == ["mlp.Wo", "head.linear2"]
    sources: Counter[str] = Counter()
    scaled: Counter[str] = Counter()
    for node in quantized:
        if node.op_type == "Div":
            floor = made[node.input[1]]  # max(ReduceMax(|x|), tiny) over the row
            assert floor.op_type == "Max" and made[floor.input[0]].op_type == "ReduceMax"
            assert made[made[floor.input[0]].input[0]].op_type == "Abs"
            assert used[node.input[1]] == 2  # divides the input, multiplies the product back
            scaled[made[node.input[0]].op_type] += 1  # the FFN's activation
        sources[node.op_type] += 1
    assert scaled == {"Mul": 3, "Relu": 1}  # mlp.Wo's Mul(Gelu(inp), gate); linear2's Relu
    # Wqkv, Wi, the head's in_proj, linear1 and key/value read a LayerNorm, Wo and out_proj
    # the attention's Reshape, mlp.Wo and linear2 the row scaling's Div
    assert sources == {"LayerNormalization": 9, "Reshape": 4, "Div": 4}


def test_row_scaling_leaves_the_fp32_model_unchanged(
    ckpt: Path, checked: Path, cache: Path
) -> None:
    import numpy as np
    import onnxruntime as ort

    from cascade.laya.config import load_config
    from cascade.laya.export import sample_feeds
    from cascade.laya.row_scale import row_scale

    fp32 = onnx.load(str(cached_export(ckpt, cache / "laya-onnx") / MODEL_FILE))
    for i, node in enumerate(fp32.graph.node):
        node.name = node.name or f"{node.op_type}_{i}"
    scaled = onnx.ModelProto()
    scaled.CopyFrom(fp32)
    names = {node.name for node, _ in _kinds(scaled)}  # every weight GEMM, scaled
    row_scale(scaled, names)
    assert len(scaled.graph.node) == len(fp32.graph.node) + 5 * len(names)
    feeds = sample_feeds(load_config(ckpt), 3, 40, 4, seed=1)
    got = [
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            ["logits"], feeds
        )[0]
        for m in (fp32, scaled)
    ]
    assert np.abs(got[0] - got[1]).max() < 1e-4


def test_int8_cache_key_follows_weights_precision_and_recipe(
    ckpt: Path, checked: Path, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = content_hash(ckpt)
    assert checked.name == int8_key(digest) != digest[:16]  # not the fp32 export's directory
    other = make_tiny(tmp_path / "other", seed=6)
    assert int8_key(content_hash(other)) != int8_key(digest)
    lines: list[str] = []
    stamp = (checked / MODEL_FILE).stat().st_mtime_ns
    assert export_int8(ckpt, cache=cache / "laya-onnx", progress=lines.append) == checked
    assert lines == [f"laya int8: cached at {checked}"]
    assert (checked / MODEL_FILE).stat().st_mtime_ns == stamp  # reused, not rewritten
    monkeypatch.setitem(int8.RECIPE, "version", int8.RECIPE["version"] + 1)
    assert int8_key(digest) != checked.name
    assert cached_int8(ckpt, cache / "laya-onnx") is None  # a new recipe is a new export
    monkeypatch.setitem(int8.RECIPE, "version", int8.RECIPE["version"] - 1)
    assert cached_int8(ckpt, cache / "laya-onnx") == checked


def test_the_report_is_stamped_and_counts_every_question(ckpt: Path, checked: Path) -> None:
    report = read_report(checked / REPORT_FILE)
    assert report.fp32_hash == content_hash(ckpt)
    assert report.int8_hash == model_hash(checked / MODEL_FILE)
    assert report.recipe == int8.recipe_id()
    assert (report.items, report.questions, report.skipped) == (6, 12, 0)
    assert set(report.cells) == {"choice:3-5", "noul:2"}
    assert sum(c.questions for c in report.cells.values()) == 12
    assert report.flips == sum(c.flips for c in report.cells.values())
    assert report.flip_rate == report.flips / 12 and report.max_flip_rate == 1.0
    assert report.passed
    assert report.max_dp == max(c.max_dp for c in report.cells.values()) > 0
    assert report.accuracy is not None and report.accuracy.labelled == 12
    assert report.speed.fp32_rows_per_s > 0 and report.speed.int8_rows_per_s > 0
    assert report.gate.policy == "default" and report.gate.applied


def _answer(probabilities: dict[str, list[float]]) -> EngineAnswer:
    types = {"dept": "choice", "urgent": "noul"}
    return EngineAnswer(
        model="m",
        usage=EngineUsage(input_tokens=1),
        results={
            q: QuestionResult(type=types[q], probabilities=p) for q, p in probabilities.items()
        },
    )


def test_compare_counts_flips_by_cell_gate_and_gold() -> None:
    questions = msgspec.convert(REQUESTS[0]["questions"], dict[str, Question])
    items = [
        Item(
            id=str(i),
            call=EngineCall(state="s", questions=questions, model="m"),
            gold={"dept": "billing", "urgent": True},
        )
        for i in range(3)
    ]
    policy = load_policy(DEFAULT_POLICY)
    assert policy.thresholds.confidence.choice.get("3-5") is not None
    floor = policy.thresholds.confidence.choice.get("3-5")
    high, low = min(1.0, floor + 0.2), max(0.0, floor - 0.2)
    rest = [(1 - high) / 2] * 2
    fp32 = [
        _answer({"dept": [high, *rest], "urgent": [0.1, 0.9]}),
        _answer({"dept": [high, *rest], "urgent": [0.1, 0.9]}),
        None,  # refused: skipped
    ]
    int8_answers = [
        _answer({"dept": [rest[0], high, rest[1]], "urgent": [0.1, 0.9]}),  # served flip
        _answer({"dept": [low, low + 0.01, 1 - 2 * low - 0.01], "urgent": [0.2, 0.8]}),
        _answer({"dept": [high, *rest], "urgent": [0.1, 0.9]}),
    ]
    got = compare(items, fp32, int8_answers, policy)
    assert (got["items"], got["questions"], got["skipped"]) == (3, 4, 1)
    assert got["cells"]["choice:3-5"].flips == 2 and got["cells"]["noul:2"].flips == 0
    assert got["flips"] == 2 and got["flip_rate"] == 0.5
    assert got["gate"]["flips_served"] == 1 and got["gate"]["flips_escalated"] == 1
    assert got["gate"]["decisions_changed"] == 1
    assert got["accuracy"].labelled == 4
    assert (got["accuracy"].fp32, got["accuracy"].int8) == (1.0, 0.5)
    assert got["max_dp"] == pytest.approx(high - rest[0])


def _settings(ckpt: Path) -> Settings:
    return Settings(laya={"english": str(ckpt)}, laya_precision="int8")


def test_gateway_refuses_int8_without_a_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_CACHE", str(tmp_path / "empty-cache"))
    ckpt = make_tiny(tmp_path / "ckpt", seed=5)
    with pytest.raises(FlipGateRefused, match="no int8 export of fp32 " + content_hash(ckpt)):
        build_gateway(_settings(ckpt))


def test_gateway_gate_on_reports(
    ckpt: Path, checked: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_CACHE", str(cache))
    path = checked / REPORT_FILE
    good = read_report(path)
    digest, have = content_hash(ckpt), model_hash(checked / MODEL_FILE)
    try:
        path.unlink()
        with pytest.raises(FlipGateRefused, match=f"no flip report at {path}") as refused:
            build_gateway(_settings(ckpt))
        assert digest in str(refused.value) and have in str(refused.value)
        write_report(path, msgspec.structs.replace(good, fp32_hash="a" * 64))
        with pytest.raises(FlipGateRefused, match="was made for fp32 a{64} / int8 ") as refused:
            build_gateway(_settings(ckpt))
        assert f"the configured weights are fp32 {digest} / int8 {have}" in str(refused.value)
        write_report(path, msgspec.structs.replace(good, int8_hash="b" * 64))
        with pytest.raises(FlipGateRefused, match="int8 b{64}"):
            build_gateway(_settings(ckpt))
        write_report(path, msgspec.structs.replace(good, flips=1, flip_rate=1 / 12))
        with pytest.raises(
            FlipGateRefused,
            match=r"changed 1 of 12 answers: flip rate 0\.0833 "
            r"is above max_flip_rate 0\.005",
        ):
            build_gateway(_settings(ckpt))
        write_report(path, msgspec.structs.replace(good, flips=0, flip_rate=0.0))
        gateway = build_gateway(_settings(ckpt))
        assert gateway.engines["laya"].precision == "int8"  # type: ignore[attr-defined]
    finally:
        write_report(path, good)


def test_a_policy_names_the_report_and_its_flip_rate(
    ckpt: Path, checked: Path, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_CACHE", str(cache))
    report = read_report(checked / REPORT_FILE)
    write_report(
        tmp_path / "reports" / "english.json",
        msgspec.structs.replace(report, flips=1, flip_rate=1 / 12),
    )
    policy = tmp_path / "policy.toml"
    policy.write_text(f"""
[tiers.laya]
kind = "laya"
checkpoints = {{ english = "{ckpt}" }}
precision = "int8"
flip_report = "reports/english.json"
max_flip_rate = 0.1
[route]
cheap = "laya"
""")
    build_gateway(Settings(policy=str(policy)))  # 1/12 is within 0.1
    policy.write_text(policy.read_text().replace("max_flip_rate = 0.1", "max_flip_rate = 0.05"))
    with pytest.raises(FlipGateRefused, match=str(tmp_path / "reports" / "english.json")):
        build_gateway(Settings(policy=str(policy)))


def test_policy_checks_the_precision_keys() -> None:
    from cascade.policy.files import check_text

    base = """
[tiers.laya]
kind = "laya"
checkpoints = { english = "/en", multilingual = "/ml" }
[route]
cheap = "laya"
"""
    for extra, message in (
        ('precision = "int4"', "precision"),
        ("max_flip_rate = 1.5", "`tiers.laya.max_flip_rate`: Expected `float` <= 1.0"),
        ('flip_report = "r.json"', "flip_report names one report"),
    ):
        policy, found = check_text(base.replace("[route]", f"{extra}\n[route]"))
        assert policy is None and any(message in f.message for f in found), (extra, found)
    policy, _ = check_text(base.replace("[route]", 'precision = "int8"\n[route]'))
    assert policy is not None and policy.tiers["laya"].precision == "int8"  # type: ignore[union-attr]


def test_the_engine_never_makes_an_int8_export_itself(tmp_path: Path) -> None:
    import asyncio

    from cascade.engines.laya import LayaEngine
    from cascade.errors import EngineUnavailable

    ckpt = make_tiny(tmp_path / "ckpt", seed=5)
    engine = LayaEngine("laya", {"english": ckpt}, onnx_cache=tmp_path / "cache", precision="int8")
    with pytest.raises(EngineUnavailable, match="--precision int8 --check"):
        asyncio.run(engine.start())
    assert not (tmp_path / "cache").exists()


def test_requests_come_back_from_a_decision_log(tmp_path: Path) -> None:
    import hashlib
    import sqlite3

    from cascade.eval.flips import items_from_log
    from cascade.store.sqlite import INSERT, INSERT_STATE, SCHEMA

    question = REQUESTS[0]["questions"]["dept"]
    state = {"body": "refund please"}
    text = json.dumps(state)
    key = hashlib.sha256(text.encode()).hexdigest()

    def row(rid: str, qid: str, mode: str, strong: list[float] | None, shadow: int) -> tuple:
        return (
            rid,
            0.0,
            "jev-latest",
            "p",
            "{}",
            qid,
            "choice",
            "3-5",
            json.dumps(question),
            key if mode == "text" else "h" * 64,
            mode,
            json.dumps({"tier": "laya", "checkpoint": "english", "probabilities": [0.5, 0.3, 0.2]}),
            json.dumps({"tier": "clef", "probabilities": strong}) if strong else None,
            "laya",
            None,
            0,
            shadow,
            0.01,
            "",
            0,
            0,
            "c",
            None,
            "r",
            None,
        )

    db = tmp_path / "log.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(SCHEMA)
        conn.execute(INSERT_STATE, (key, text))
        conn.executemany(
            INSERT,
            [
                row("a", "q1", "text", [0.1, 0.8, 0.1], 1),  # shadowed: gold is the strong answer
                row("a", "q2", "text", None, 0),
                row("b", "q1", "hash", None, 0),  # no state to rerun
            ],
        )
    items, unusable = items_from_log(db)
    assert unusable == 1 and len(items) == 1
    (item,) = items
    assert item.call.state == state and set(item.call.questions) == {"q1", "q2"}
    assert item.gold == {"q1": "tech"}


def test_the_bench_compares_both_recipes_on_the_same_rows(
    ckpt: Path, checked: Path, cache: Path, tmp_path: Path
) -> None:
    from cascade.bench.int8_reference import per_tensor, same_rows_flips
    from cascade.laya.preview import Previewer

    export_dir = cached_export(ckpt, cache / "laya-onnx")
    assert export_dir is not None
    fp32 = export_dir / MODEL_FILE
    reference = per_tensor(fp32, tmp_path / "per-tensor" / MODEL_FILE)
    ops = Counter(n.op_type for n in onnx.load(str(reference)).graph.node)
    chosen = int8.int8_gemms(onnx.load(str(fp32)), 3, 2)
    assert ops["MatMulInteger"] > len(chosen)  # every GEMM, the read positions' too
    scales = [i for i in onnx.load(str(reference)).graph.initializer if i.name.endswith("_scale")]
    assert scales and all(len(i.dims) == 0 for i in scales)  # one scale per tensor
    previewer = Previewer({"english": ckpt})
    calls = msgspec.convert(
        [{"state": r["state"], "questions": r["questions"], "model": "english"} for r in REQUESTS],
        list[EngineCall],
    )
    rows = [row for call in calls for row in previewer.plan(call).rows]
    info = previewer.checkpoints["english"]
    got = same_rows_flips(
        fp32,
        {"fp32": fp32, "recipe": checked / MODEL_FILE, "per-tensor": reference},
        rows,
        info.cfg,
        info.tok.pad_id,
        threads=1,
        batch=4,
    )
    assert got["fp32"] == {"questions": 12, "flips": 0, "mean_dp": 0.0, "max_dp": 0.0}
    for name in ("recipe", "per-tensor"):
        assert got[name]["questions"] == 12 and 0 <= got[name]["flips"] <= 12
        assert 0 < got[name]["mean_dp"] <= got[name]["max_dp"] < 1
