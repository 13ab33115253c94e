"""The keys file: both formats, strict decoding with each error at its line, hashed keys."""

from __future__ import annotations

import hashlib
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cascade.errors import Unauthorized
from cascade.settings import Settings
from cascade.tenants.files import KeysFileError, is_old_format, load_tenants, parse
from cascade.tenants.keys import Tenants, digest, hashed


def sha(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def write(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "keys.toml"
    path.write_text(text)
    return Settings(api_keys_file=str(path))


ACME = f"""\
# two tenants
[[tenant]]
name = "acme"
keys = ["{sha("acme-1")}", "{sha("acme-2")}"]
requests_per_min = 600
questions_per_min = 3000
input_tokens_per_min = 2000000
max_inflight = 32
strong_questions_per_min = 300
expires = 2027-01-01T00:00:00Z

[[tenant]]
name = "beta"
keys = ["{sha("beta-1")}"]
"""


def test_the_issue_example_loads_and_each_key_finds_its_tenant(tmp_path: Path) -> None:
    tenants = load_tenants(write(tmp_path, ACME))
    acme = tenants.verify("acme-2", now=datetime(2026, 12, 1, tzinfo=UTC))
    assert acme.name == "acme" and acme.limits.strong_questions_per_min == 300
    assert acme.limits.max_inflight == 32 and acme.expires == datetime(2027, 1, 1, tzinfo=UTC)
    assert tenants.verify("beta-1").name == "beta" and not tenants.verify("beta-1").limits.any()
    for wrong in (None, "", "acme-3", "acme-1 ", sha("acme-1")):  # a hash is not a key
        with pytest.raises(Unauthorized):
            tenants.verify(wrong)


def test_an_expired_key_is_refused(tmp_path: Path) -> None:
    tenants = load_tenants(write(tmp_path, ACME))
    with pytest.raises(Unauthorized, match="expired"):
        tenants.verify("acme-1", now=datetime(2027, 1, 1, tzinfo=UTC))


def test_the_old_one_key_per_line_format_still_loads(tmp_path: Path) -> None:
    text = "# keys\nk1\n\n  k2  \nsk-abc_DEF.ghi=/+\n"
    assert is_old_format(text)
    tenants = load_tenants(write(tmp_path, text))
    assert {tenants.verify(k).name for k in ("k1", "k2", "sk-abc_DEF.ghi=/+")} == {""}
    with pytest.raises(Unauthorized):
        tenants.verify("k3")


@pytest.mark.parametrize(
    "text",
    [
        ACME,
        "[limits]\nbackend = 'local'\n",
        'name="x"\n',
        "tenant=1\n",
        "[[tenants]]\nname = 'x'\n",
    ],
)
def test_anything_that_is_not_one_token_per_line_is_toml(text: str) -> None:
    assert not is_old_format(text)


def test_inline_keys_are_unnamed_tenants_and_no_keys_is_auth_off() -> None:
    assert load_tenants(Settings(api_keys=("a", "b"))).verify("b").name == ""
    off = load_tenants(Settings())
    assert not off.enabled and off.verify(None).name == ""


def test_keys_are_kept_as_digests_only(tmp_path: Path) -> None:
    tenants = load_tenants(write(tmp_path, ACME))
    stored = list(tenants._keys)
    assert digest("acme-1") in stored and all(isinstance(d, bytes) for d in stored)
    assert hashed("acme-1") == sha("acme-1")


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (
            '[[tenant]]\nname = "a"\nkeys = []\nrequests_per_mn = 5\n',
            4,
            "unknown key `requests_per_mn`",
        ),
        (
            '[[tenant]]\nname = "a"\n\n[[tenant]]\nname = "b"\nmax_inflight = "x"\n',
            6,
            "`max_inflight`: Expected `int",
        ),
        ('[[tenant]]\nname = "a"\n[[tenant]]\nname = "a"\n', 4, "tenant `a` is defined twice"),
        ('[[tenant]]\nname = "a"\nkeys = ["k1"]\n', 3, "never a key"),
        (
            f'[[tenant]]\nname = "a"\nkeys = ["{sha("x")}"]\n[[tenant]]\nname = "b"\n'
            f'keys = ["{sha("x")}"]\n',
            6,
            "a key of tenant `a` is listed again",
        ),
        ("[[tenant]]\nkeys = []\n", 1, "missing the key `name`"),
        ('[[tenant]]\nname = "has space"\n', 2, "`name`"),
        ('[[tenant]]\nname = "a"\nrequests_per_min = 0\n', 3, ">= 1"),
        ('[[tenant]]\nname = "a"\nexpires = 2027-01-01T00:00:00\n', 3, "`expires`"),
        ('[limits]\nbackend = "redis"\n', 2, "needs url"),
        ('[limits]\nbackend = "memcached"\n', 2, "`backend`"),
        ('[limits]\nbackend = "local"\nretry_s = 0\n', 3, "`retry_s`: Expected `float` > 0.0"),
        ('[[tenant]]\nname = "a"\nkeys = [\n', 3, "invalid TOML"),
        ('[[tenant]]\nname = "a"\n[other]\nx = 1\n', 3, "unknown key `other`"),
    ],
)
def test_a_bad_keys_file_names_the_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    with pytest.raises(KeysFileError) as caught:
        load_tenants(write(tmp_path, text))
    message = caught.value.messages[0]
    assert message.startswith(f"{tmp_path / 'keys.toml'}:{line}: error: "), message
    assert words in message


def test_every_error_is_reported_at_once() -> None:
    text = '[[tenant]]\nname = "a"\nfoo = 1\n[[tenant]]\nname = "b"\nbar = 2\n'
    with pytest.raises(KeysFileError) as caught:
        parse(text, "k.toml")
    assert [m.split(": error")[0] for m in caught.value.messages] == ["k.toml:3", "k.toml:6"]


def test_a_missing_tenant_policy_file_is_named_at_boot(tmp_path: Path) -> None:
    text = '[[tenant]]\nname = "a"\npolicy = "nope.toml"\n'
    with pytest.raises(KeysFileError, match=r"keys.toml:3: error: tenant policy .*nope.toml"):
        load_tenants(write(tmp_path, text))


def _builtin_calls(tenants: Tenants, token: str | None) -> list[str]:
    """The C functions ``tenants.find(token)`` calls, in order (``sys.setprofile``): its work,
    counted instead of timed."""
    calls: list[str] = []

    def profile(frame: object, event: str, arg: object) -> None:
        if event == "c_call":
            calls.append(getattr(arg, "__qualname__", repr(arg)))

    sys.setprofile(profile)
    try:
        tenants.find(token)
    finally:
        sys.setprofile(None)
    return calls


def test_verification_is_one_hash_and_one_lookup_whatever_the_keys() -> None:
    """The same work at 4 keys as at 100k, for the right key, a wrong key or none (a loop over
    every digest did 100k comparisons)."""
    from cascade.tenants.model import Tenant

    few = Tenants([(digest(f"k{i}"), Tenant(name=f"t{i}")) for i in range(4)])
    many = Tenants([(digest(f"k{i}"), Tenant(name=f"t{i}")) for i in range(100_000)])
    assert many.find("k99999").name == "t99999" and many.find("k0").name == "t0"
    assert many.find("nope") is None and many.find(None) is None and many.find("") is None
    work = _builtin_calls(few, "k3")
    assert len(work) <= 5, work
    assert _builtin_calls(many, "k99999") == work
    assert _builtin_calls(many, "wrong") == _builtin_calls(many, None) == work


def test_loading_reads_the_structs_fields_once_not_per_tenant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``msgspec.structs.fields`` evaluates annotations (0.3 ms a call): read per tenant, it made
    a boot with 100k tenants take 68 s."""
    import msgspec

    real, calls = msgspec.structs.fields, []
    monkeypatch.setattr(msgspec.structs, "fields", lambda cls: calls.append(cls) or real(cls))
    text = "".join(
        f'[[tenant]]\nname = "t{i}"\nkeys = ["{sha(f"k{i}")}"]\nrequests_per_min = 5\n'
        for i in range(500)
    )
    tenants = load_tenants(write(tmp_path, text))
    assert tenants.verify("k499").limits.requests_per_min == 5
    assert len(calls) <= 2
