"""Numbers that cannot work stop the boot: every numeric setting and policy number has a range,
checked before anything loads, and a value outside it is one line naming it, exit status 1.

The commands run as a user runs them (``python -m cascade``); a refused boot never reaches the
port, the demo's weights or the upstream.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from cascade.settings import Settings
from tests.cli.test_errors import cascade, refused

UPSTREAM = ("serve", "--upstream", "http://127.0.0.1:9", "--port", "0")


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("CASCADE_MAX_INFLIGHT", "0", "expected `int` >= 1"),
        ("CASCADE_ADMISSION_DEADLINE_S", "-5", "expected `float` > 0.0"),
        ("CASCADE_BODY_READ_TIMEOUT_S", "inf", "expected `float` <= 86400.0"),
        ("CASCADE_KEEP_ALIVE_S", "nan", "expected `float` > 0.0"),
        ("CASCADE_MIN_BODY_RATE", "0", "expected `float` > 0.0"),
        ("CASCADE_DRAIN_S", "-1", "expected `float` >= 0.0"),
        ("CASCADE_DECODE_THREADS", "0", "expected `int` >= 1"),
        ("CASCADE_CLEF_MAX_LENGTH", "0", "expected `int` >= 1"),
    ],
)
def test_a_setting_out_of_range_is_one_line_and_exit_1(
    variable: str, value: str, expected: str, tmp_path: Path
) -> None:
    out = refused(cascade(*UPSTREAM, env={variable: value}), 1)
    assert out.strip() == f"cascade serve: error: {variable}={value}: {expected}", out


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--admission-deadline", "0", "--admission-deadline 0.0: expected `float` > 0.0"),
        ("--max-length", "-1", "--max-length -1: expected `int` >= 1"),
    ],
)
def test_a_flag_out_of_range_names_the_flag_as_typed(flag: str, value: str, expected: str) -> None:
    out = refused(cascade(*UPSTREAM, flag, value), 1)
    assert out.strip() == f"cascade serve: error: {expected}", out


def test_every_numeric_setting_has_a_lower_bound() -> None:
    """A new number without a range would boot with a value that refuses everything."""
    info = msgspec.inspect.type_info(Settings)
    assert isinstance(info, msgspec.inspect.StructType)
    unbounded = [
        f.name
        for f in info.fields
        if isinstance(f.type, msgspec.inspect.IntType | msgspec.inspect.FloatType)
        and f.type.ge is None
        and f.type.gt is None
    ]
    assert unbounded == []


def test_every_float_setting_is_finite() -> None:
    info = msgspec.inspect.type_info(Settings)
    assert isinstance(info, msgspec.inspect.StructType)
    floats = [f for f in info.fields if isinstance(f.type, msgspec.inspect.FloatType)]
    assert floats and all(f.type.le is not None or f.type.lt is not None for f in floats)


@pytest.mark.parametrize(
    ("table", "line"),
    [
        (
            '[tiers.up]\nkind = "upstream"\nurls = ["http://127.0.0.1:9"]\nhealth_interval_s = 0\n',
            ":4: error: `tiers.up.health_interval_s`: Expected `float` > 0.0",
        ),
        (
            '[tiers.laya]\nkind = "laya"\ncheckpoints = { english = "./tiny" }\n'
            "max_batch_size = 0\n",
            ":4: error: `tiers.laya.max_batch_size`: Expected `int` >= 1",
        ),
        (
            '[tiers.laya]\nkind = "laya"\ncheckpoints = { english = "./tiny" }\nmax_wait_s = -1\n',
            ":4: error: `tiers.laya.max_wait_s`: Expected `float` >= 0.0",
        ),
        (
            '[tiers.clef]\nkind = "clef"\nmax_batch_tokens = 0\n',
            ":3: error: `tiers.clef.max_batch_tokens`: Expected `int` >= 1",
        ),
    ],
)
def test_a_policy_number_out_of_range_stops_the_boot(table: str, line: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(table)
    out = refused(cascade("serve", "--policy", str(policy)), 1, f"{policy}{line}")
    assert "ready" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["bench", "load", "--url", "http://127.0.0.1:9", "--concurrency", "0"],
            "argument --concurrency: expected an integer >= 1, got '0'",
        ),
        (
            ["bench", "load", "--url", "http://127.0.0.1:9", "--duration", "inf"],
            "argument --duration: expected a finite number of seconds > 0, got 'inf'",
        ),
        (
            ["bench", "load", "--url", "http://127.0.0.1:9", "--repeat-share", "1.5"],
            "argument --repeat-share: expected a share in [0, 1], got '1.5'",
        ),
        (
            ["calibrate", "data.jsonl", "--out", "c.toml", "--target-accuracy", "nan"],
            "argument --target-accuracy: expected a share in [0, 1], got 'nan'",
        ),
        (
            ["distill", "data.jsonl", "--batch-size", "0"],
            "argument --batch-size: expected an integer >= 1, got '0'",
        ),
    ],
)
def test_a_command_flag_out_of_range_is_a_usage_error(
    args: list[str], message: str, tmp_path: Path
) -> None:
    """Before the command reaches a server, a file or a model."""
    refused(cascade(*args, cwd=tmp_path), 2, message)
