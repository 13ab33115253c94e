"""Calibration files: round trip, policies that reference them, the gate hook in routing, the
returned-probabilities switch, and refusing weights other than the stamped ones."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from cascade.build import build_gateway, fingerprints
from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.policy.calibration import (
    CalibrationError,
    CalibrationFile,
    CalibrationMismatch,
    CalibrationStamp,
    CellFit,
    apply_calibration,
    bands_of,
    read_calibration,
    temper,
    write_calibration,
)
from cascade.policy.files import PolicyError, load_policy
from cascade.policy.model import Checkpoints, ClefTier, LayaTier, Policy, Route
from cascade.policy.routing import post_route, pre_route
from cascade.schema import NoulQuestion
from cascade.settings import Settings

CAL = CalibrationFile(
    stamp=CalibrationStamp(
        checkpoints={"laya": "a" * 64, "clef": "b" * 64},
        items=10,
        questions=9,
        target="escalation",
        value=0.3,
        data="d.jsonl",
    ),
    thresholds=bands_of({("noul", "2"): 0.7, ("choice", "3-5"): 0.45}),
    temperatures=bands_of({("noul", "2"): 3.0, ("choice", "3-5"): 1.25}),
    fit={"noul:2": CellFit(n=9, pooled=True, temperature=3.0, threshold=0.7, escalation=0.3)},
)
POLICY = Policy(
    tiers={"laya": LayaTier(checkpoints=Checkpoints(english="x")), "clef": ClefTier(release="x")},
    route=Route(cheap="laya", strong="clef"),
)


def test_a_calibration_file_reads_back_what_was_written(tmp_path: Path):
    write_calibration(tmp_path / "cal.toml", CAL, header="a header\nover two lines")
    assert read_calibration(tmp_path / "cal.toml") == CAL
    assert (tmp_path / "cal.toml").read_text().startswith("# a header\n# over two lines\n")


def test_a_policy_references_its_calibration_relative_to_itself(tmp_path: Path):
    write_calibration(tmp_path / "cal.toml", CAL)
    (tmp_path / "p.toml").write_text(
        '[tiers.laya]\nkind = "laya"\ncheckpoints = { english = "./x" }\n'
        '[tiers.clef]\nkind = "clef"\n[route]\ncheap = "laya"\nstrong = "clef"\n'
        '[thresholds.margin.noul]\n"2" = 0.5\n'
        '[calibration]\nfile = "cal.toml"\napply = "probabilities"\n'
    )
    policy = load_policy(tmp_path / "p.toml")
    assert policy.thresholds.confidence == CAL.thresholds
    assert policy.thresholds.margin.noul.get("2") is None  # the fit owns the gate
    assert policy.calibration.temperatures == CAL.temperatures
    assert policy.calibration.apply == "probabilities"
    assert policy.calibration.file == str(tmp_path / "cal.toml")
    (tmp_path / "cal.toml").write_text("version = 1\n")
    with pytest.raises(PolicyError, match=r"p.toml:\d+: error: .*not a cascade calibration"):
        load_policy(tmp_path / "p.toml")


def _noul_call() -> tuple[EngineCall, EngineAnswer]:
    call = EngineCall(
        state="s", model="jev-latest", questions={"u": NoulQuestion(instructions="urgent?")}
    )
    answer = EngineAnswer(
        model="english",
        usage=EngineUsage(input_tokens=3),
        results={"u": QuestionResult(type="noul", probabilities=[0.2, 0.8])},
    )
    return call, answer


def test_the_gate_reads_tempered_confidence():
    call, answer = _noul_call()
    uncalibrated = msgspec.structs.replace(
        POLICY, thresholds=apply_calibration(POLICY, CAL, file="c").thresholds
    )  # the same thresholds, no temperatures
    pre = pre_route(uncalibrated, call, None)
    assert post_route(uncalibrated, call, pre, answer, None) == {}  # 0.8 >= 0.7
    calibrated = apply_calibration(POLICY, CAL, file="c")
    # T = 3: max p 0.8 -> 0.8^(1/3) / (0.8^(1/3) + 0.2^(1/3)) = 0.613 < 0.7
    assert max(temper([0.2, 0.8], 3.0)) == pytest.approx(0.6135, abs=1e-4)
    assert post_route(calibrated, call, pre, answer, None) == {"u": "low_confidence"}


@pytest.mark.parametrize("apply", ["gate", "probabilities"])
def test_returned_probabilities_change_only_when_the_policy_says_so(apply):
    cal = msgspec.structs.replace(CAL, thresholds=bands_of({("noul", "2"): 0.5}))
    policy = apply_calibration(POLICY, cal, file="c", apply=apply)
    call, answer = _noul_call()
    engines = {"laya": FakeEngine("laya", lambda c: answer), "clef": FakeEngine("clef")}

    async def run() -> float:
        gateway = Gateway(policy, engines)
        await gateway.start()
        outcome = await gateway.systemone(call)
        await gateway.aclose()
        assert outcome.tiers == {"u": "laya"}
        return outcome.response.answers["u"].noul

    expected = 0.8 if apply == "gate" else round(temper([0.2, 0.8], 3.0)[1], 4)
    assert asyncio.run(run()) == pytest.approx(expected)


def test_the_gateway_refuses_a_calibration_for_other_weights(tmp_path: Path):
    settings = Settings(
        demo=True, demo_dir=str(tmp_path / "demo"), calibration=str(tmp_path / "cal.toml")
    )
    write_calibration(tmp_path / "cal.toml", CAL)
    with pytest.raises(CalibrationMismatch) as refused:
        build_gateway(settings)
    from cascade.build import demo_policy

    real = fingerprints(demo_policy(tmp_path / "demo", settings))
    message = str(refused.value)
    assert "a" * 64 in message and real["laya"] in message
    assert "b" * 64 in message and real["clef"] in message
    stamped = msgspec.structs.replace(
        CAL, stamp=msgspec.structs.replace(CAL.stamp, checkpoints=real)
    )
    write_calibration(tmp_path / "cal.toml", stamped)
    gateway = build_gateway(settings)  # the right weights boot
    assert gateway.policy.calibration.checkpoints == real


def test_a_calibration_file_that_is_not_utf8_names_the_file(tmp_path: Path):
    write_calibration(tmp_path / "cal.toml", CAL, header="caf\xe9")
    path = tmp_path / "cal.toml"
    path.write_bytes(path.read_bytes().replace("caf\xe9".encode(), "caf\xe9".encode("latin-1")))
    with pytest.raises(CalibrationError, match=r"cal\.toml: not UTF-8 text \(byte 5: "):
        read_calibration(path)


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_calibration_temperatures_must_be_finite(tmp_path: Path, value: str):
    write_calibration(tmp_path / "cal.toml", CAL)
    path = tmp_path / "cal.toml"
    text = path.read_text()
    start = text.index("[temperatures.")
    line_end = text.index("\n", text.index(" = ", start))
    line_start = text.rindex("\n", 0, line_end) + 1
    key = text[line_start:line_end].split(" = ")[0]
    path.write_text(text[:line_start] + f"{key} = {value}" + text[line_end:])
    with pytest.raises(CalibrationError, match="is not a finite number > 0"):
        read_calibration(path)
