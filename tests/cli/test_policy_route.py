"""``cascade policy check`` and ``cascade route`` through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade.cli import main
from cascade.laya.tiny import make_tiny

ROOT = Path(__file__).parents[2]
POLICIES = ROOT / "policies"

TWO_TIER = """\
[tiers.laya]
kind = "laya"
checkpoints = { english = "./tiny", multilingual = "./tiny/multilingual" }

[tiers.clef]
kind = "clef"

[route]
cheap = "laya"
strong = "clef"
max_choice_options = 8
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A policy file next to a tiny English + multilingual bundle (max_len 512, head 192)."""
    root = tmp_path_factory.mktemp("route")
    make_tiny(root / "tiny")
    make_tiny(root / "tiny" / "multilingual", seed=1)
    (root / "policy.toml").write_text(TWO_TIER)
    return root


def requests(path: Path) -> Path:
    noul = {"type": "noul", "instructions": "Is it urgent?"}
    choice = {"type": "choice", "criteria": ["billing", "tech"]}
    lines = [
        {"id": "1", "source": "a", "state": "refund please", "questions": {"u": noul}},
        {"id": "2", "source": "a", "state": "refund please " * 300, "questions": {"u": noul}},
        {
            "id": "3",
            "source": "b",
            "state": "where is it",
            "questions": {
                "c": choice,
                "wide": {"type": "choice", "criteria": [f"o{i}" for i in range(9)]},
            },
        },
        {
            "id": "4",
            "source": "b",
            "state": "Где мой заказ? Я жду уже неделю.",
            "questions": {"u": noul},
        },
        {"id": "5", "source": "b", "state": "look", "images": ["aGk="], "questions": {"u": noul}},
        {"id": "6", "source": "c", "state": "hi", "model": "gpt-4", "questions": {"u": noul}},
        {"id": "7", "source": "c", "state": "hi", "questions": {"s": {"type": "score"}}},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_policy_check_passes_the_shipped_policies(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(p) for p in POLICIES.glob("*.toml"))
    assert main(["policy", "check", *files]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{f}: ok" for f in files]


def test_policy_check_reports_lines_and_fails_on_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        TWO_TIER.replace('strong = "clef"', 'strong = "gpu"')
        + '[thresholds.confidence]\nchoice = { "2" = 0.3 }\n'
    )
    warn = tmp_path / "warn.toml"
    warn.write_text(TWO_TIER + '[thresholds.confidence]\nchoice = { "2" = 0.3 }\n')
    assert main(["policy", "check", str(bad)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{bad}:5: warning: tier `clef` is not used by [route]",
        f"{bad}:10: error: route.strong names an undefined tier `gpu`",
        f"{bad}:13: warning: confidence threshold 0.3 can never be undercut in band 2 "
        "(max p >= 0.5 there): it never escalates",
    ]
    assert main(["policy", "check", str(warn)]) == 0
    assert "warning" in capsys.readouterr().out
    assert main(["policy", "check", str(tmp_path / "missing.toml")]) == 1
    assert "missing.toml: error" in capsys.readouterr().out


def test_route_splits_a_request_file(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = requests(bundle / "requests.jsonl")
    assert main(["route", str(path), "--policy", str(bundle / "policy.toml"), "--json"]) == 0
    out = capsys.readouterr()
    got = json.loads(out.out)
    assert got["requests"] == 5 and got["questions"] == 6
    assert got["requests_by_route"] == {"cheap": 2, "strong": 2, "split": 1}
    assert got["questions_by_tier"] == {"laya": 3, "clef": 3}
    assert got["reasons"] == {"cheap": 3, "state_too_long": 1, "too_many_options": 1, "images": 1}
    # the Cyrillic state runs on the multilingual checkpoint
    assert got["checkpoints"] == {"english": 2, "multilingual": 1}
    assert got["refused"] == {"api_usage_error": 1, "invalid_request_error": 1}
    assert got["sources"]["b"] == {
        "requests": 3,
        "questions": 4,
        "cheap": 2,
        "strong": 2,
        "refused": 0,
    }
    assert f"{path}:6: refused: unknown model `gpt-4`" in out.err


def test_route_prints_tables_and_honours_an_english_only_bundle(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = requests(tmp_path / "requests.jsonl")
    english = tmp_path / "english-only"
    make_tiny(english)
    assert (
        main(["route", str(path), "--policy", str(bundle / "policy.toml"), "--laya", str(english)])
        == 0
    )
    table = capsys.readouterr().out
    assert table.startswith("5 requests, 6 questions (pre-routing only")
    assert "  script                           1    16.7" in table
    assert "  b                         3         4       1       3      75.0        0" in table


def test_route_without_local_checkpoints_says_what_to_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    policy = tmp_path / "p.toml"
    policy.write_text(TWO_TIER.replace('"./tiny"', '"convaiinnovations/laya"'))
    path = requests(tmp_path / "requests.jsonl")
    assert main(["route", str(path), "--policy", str(policy)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{policy}: error: ") and err.rstrip().endswith("pass --laya DIR")


def test_route_refuses_broken_lines_instead_of_crashing(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = bundle / "broken.jsonl"
    path.write_text(
        '{"state": "x", "questions": {"q": {"type": "noul"\n'
        '{"state": "x", "questions": {"q": {"type": "box"}}}\n'
        '{"state": "x", "questions": {"q": {"type": "noul", "instructions": "ok"}}}\n'
    )
    assert main(["route", str(path), "--policy", str(bundle / "policy.toml"), "--json"]) == 0
    out = capsys.readouterr()
    got = json.loads(out.out)
    assert got["requests"] == 1
    assert got["refused"] == {"invalid_request_error": 2}
    assert f"{path}:1: refused: request body is not valid JSON" in out.err


def test_policy_check_names_a_file_that_is_not_utf8_and_refuses_nan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    latin = tmp_path / "latin1.toml"
    latin.write_bytes("# caf\xe9\n".encode("latin-1") + TWO_TIER.encode())
    nan = tmp_path / "nan.toml"
    nan.write_text(TWO_TIER.replace('kind = "clef"\n', 'kind = "clef"\ntimeout_s = nan\n'))
    assert main(["policy", "check", str(latin), str(nan)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{latin}:1: error: not UTF-8 text (byte 5: invalid continuation byte)",
        f"{nan}:7: error: `tiers.clef.timeout_s` must be a finite number, not nan",
    ]
