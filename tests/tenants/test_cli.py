"""``cascade keys add`` / ``cascade keys list``: one line of stdout, only hashes on disk; concurrent
adds keep every key."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

from cascade.settings import Settings
from cascade.tenants.files import load_tenants, parse
from tests.cli.test_errors import ROOT, cascade, refused


def test_add_prints_one_key_once_and_writes_only_its_hash(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    first = cascade("keys", "add", "acme", "--file", str(path))
    assert first.returncode == 0 and first.stderr == ""
    assert first.stdout.count("\n") == 1 and first.stdout.endswith("\n")
    key = first.stdout.strip()
    assert len(key) > 40 and stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert key not in text and hashlib.sha256(key.encode()).hexdigest() in text
    second = cascade("keys", "add", "acme", "--file", str(path)).stdout.strip()
    third = cascade("keys", "add", "beta", "--file", str(path)).stdout.strip()
    tenants = load_tenants(Settings(api_keys_file=str(path)))
    assert [tenants.verify(k).name for k in (key, second, third)] == ["acme", "acme", "beta"]
    assert len({key, second, third}) == 3


def test_add_keeps_the_rest_of_the_file_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    before = (
        '# our tenants\n[[tenant]]\nname = "acme"  # the first\nkeys = [\n'
        f'  "sha256:{"a" * 64}",  # laptop\n]\nrequests_per_min = 60\n\n'
        '[[tenant]]\nname = "beta"\n\n[limits]\non_error = "closed"\n'
    )
    path.write_text(before)
    path.chmod(0o640)
    key = cascade("keys", "add", "beta", "--file", str(path)).stdout.strip()
    other = cascade("keys", "add", "acme", "--file", str(path)).stdout.strip()
    after = path.read_text()
    hashes = {k: "sha256:" + hashlib.sha256(k.encode()).hexdigest() for k in (key, other)}
    assert after == before.replace(
        'name = "beta"\n', f'name = "beta"\nkeys = ["{hashes[key]}"]\n'
    ).replace("keys = [\n", f'keys = ["{hashes[other]}",\n')
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    tenants = load_tenants(Settings(api_keys_file=str(path)))
    assert tenants.verify(key).name == "beta" and tenants.verify(other).name == "acme"


def test_list_shows_names_and_limits_never_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    key = cascade("keys", "add", "acme", "--file", str(path)).stdout.strip()
    path.write_text(path.read_text() + "max_inflight = 4\nexpires = 2027-01-01T00:00:00Z\n")
    out = cascade("keys", "list", "--file", str(path))
    assert out.returncode == 0, out.stderr
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert key not in out.stdout and digest not in out.stdout
    row = out.stdout.splitlines()[1].split()
    assert row[:3] == ["acme", "1", digest[:8] + "…"] and "max_inflight=4" in row
    assert "2027-01-01T00:00:00+00:00" in row
    old = tmp_path / "old"
    old.write_text("k1\nk2\n")
    listed = cascade("keys", "list", "--file", str(old)).stdout
    assert "2 unnamed keys" in listed and "k1" not in listed


def test_mistakes_are_a_line_or_two_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    refused(cascade("keys", "add", "no spaces", "--file", str(path)), 1, "tenant name")
    assert not path.exists()
    refused(cascade("keys", "list", "--file", str(path)), 1, str(path))
    path.write_text('[[tenant]]\nname = "a"\nbogus = 1\n')
    refused(cascade("keys", "add", "a", "--file", str(path)), 1, f"{path}:3: error:")
    assert path.read_text() == '[[tenant]]\nname = "a"\nbogus = 1\n'  # untouched
    old = tmp_path / "old"
    old.write_text("k1\n")
    refused(cascade("keys", "add", "a", "--file", str(old)), 1, "one key per line")


# `cascade keys ...` with its modules loaded, waiting for its stdin to close before it runs:
# the test starts ten, then lets them all edit the file at the same moment.
AT_ONCE = """import sys
from cascade.cli import build_parser, run
from cascade.tenants import editing, files, keys
args = build_parser().parse_args(sys.argv[1:])
print("ready", flush=True)
sys.stdin.read()
sys.exit(run(args))
"""


def at_once(runs: list[list[str]]) -> list[tuple[int, str, str]]:
    """``cascade ARGS...`` for each of ``runs``, all started, then let go at the same moment:
    each one's status, stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}
    env["PYTHONPATH"] = str(ROOT)
    with contextlib.ExitStack() as stack:  # each Popen closes its pipes and is waited for
        procs = [
            stack.enter_context(
                subprocess.Popen(
                    [sys.executable, "-c", AT_ONCE, *args],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
            )
            for args in runs
        ]
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
        outs = [
            (proc.stdout.read(), proc.stderr.read())
            for proc in procs
            if proc.stdout is not None and proc.stderr is not None
        ]
        for proc in procs:
            proc.wait(timeout=120)
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outs, strict=True)]


def test_concurrent_adds_keep_every_key_they_print(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    names = [f"t{i % 3}" for i in range(10)]  # three tenants: new ones and existing ones
    ran = at_once([["keys", "add", name, "--file", str(path)] for name in names])
    assert [status for status, _, _ in ran] == [0] * 10, ran
    tenants = load_tenants(Settings(api_keys_file=str(path)))
    found = [tenants.find(out.strip()) for _, out, _ in ran]
    assert [t.name if t else None for t in found] == names


def test_remove_takes_one_key_or_one_tenant_and_keeps_every_other_byte(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    key_a1, key_a2, key_b = (
        cascade("keys", "add", name, "--file", str(path)).stdout.strip()
        for name in ("acme", "acme", "beta")
    )
    path.write_text(path.read_text() + '\n[limits]\nbackend = "local"  # per replica\n')
    before = path.read_text()
    prefix = hashlib.sha256(key_a1.encode()).hexdigest()[:8]
    done = cascade("keys", "remove", "acme", "--key", prefix, "--file", str(path))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    hashed = f'"sha256:{hashlib.sha256(key_a1.encode()).hexdigest()}"'
    assert hashed in before  # `add` put the newer key first: the item and its comma go
    assert path.read_text() == before.replace(f", {hashed}", "").replace(f"{hashed}, ", "")
    tenants = load_tenants(Settings(api_keys_file=str(path)))
    assert tenants.find(key_a1) is None
    found = [tenants.find(k) for k in (key_a2, key_b)]
    assert [t.name if t else None for t in found] == ["acme", "beta"]
    done = cascade("keys", "remove", "beta", "--file", str(path))
    assert done.returncode == 0, done.stderr
    tenants = load_tenants(Settings(api_keys_file=str(path)))
    assert tenants.find(key_b) is None and tenants.find(key_a2) is not None
    assert path.read_text().endswith(']\n\n[limits]\nbackend = "local"  # per replica\n')


def test_remove_refuses_what_it_cannot_do_and_leaves_the_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    key = cascade("keys", "add", "acme", "--file", str(path)).stdout.strip()
    text = path.read_text()
    digits = hashlib.sha256(key.encode()).hexdigest()[:8]
    refused(
        cascade("keys", "remove", "acme", "--key", digits, "--file", str(path)),
        1,
        "only key",
        "cascade keys remove acme",
    )
    refused(cascade("keys", "remove", "globex", "--file", str(path)), 1, "no tenant `globex`")
    other = "0" * 8 if digits != "0" * 8 else "1" * 8
    refused(
        cascade("keys", "remove", "acme", "--key", other, "--file", str(path)),
        1,
        "no key whose hash starts with",
    )
    refused(cascade("keys", "remove", "acme", "--key", "xyz", "--file", str(path)), 2, "--key xyz")
    refused(
        cascade("keys", "remove", "acme", "--file", str(tmp_path / "none.toml")),
        1,
        "no such keys file",
    )
    assert path.read_text() == text


def test_concurrent_adds_and_removes_each_apply(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    for i in range(5):
        cascade("keys", "add", f"old{i}", "--file", str(path))
    runs = [["keys", "remove", f"old{i}", "--file", str(path)] for i in range(5)]
    runs += [["keys", "add", f"new{i}", "--file", str(path)] for i in range(5)]
    ran = at_once(runs)
    assert [status for status, _, _ in ran] == [0] * 10, ran
    tenants = load_tenants(Settings(api_keys_file=str(path)))
    names = [e.name for e in parse(path.read_text(), str(path)).entries]
    assert sorted(names) == [f"new{i}" for i in range(5)]
    assert all(tenants.find(out.strip()) is not None for _, out, _ in ran[5:])
