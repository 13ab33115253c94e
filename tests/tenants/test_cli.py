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
from cascade.tenants.files import load_tenants
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
    before = ('# our tenants\n[[tenant]]\nname = "acme"  # the first\nkeys = [\n'
              f'  "sha256:{"a" * 64}",  # laptop\n]\nrequests_per_min = 60\n\n'
              '[[tenant]]\nname = "beta"\n\n[limits]\non_error = "closed"\n')
    path.write_text(before)
    path.chmod(0o640)
    key = cascade("keys", "add", "beta", "--file", str(path)).stdout.strip()
    other = cascade("keys", "add", "acme", "--file", str(path)).stdout.strip()
    after = path.read_text()
    hashes = {k: "sha256:" + hashlib.sha256(k.encode()).hexdigest() for k in (key, other)}
    assert after == before.replace(
        'name = "beta"\n', f'name = "beta"\nkeys = ["{hashes[key]}"]\n').replace(
        'keys = [\n', f'keys = ["{hashes[other]}",\n')
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


def test_concurrent_adds_keep_every_key_they_print(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    names = [f"t{i % 3}" for i in range(10)]  # three tenants: new ones and existing ones
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}
    env["PYTHONPATH"] = str(ROOT)
    with contextlib.ExitStack() as stack:  # each Popen closes its pipes and is waited for
        procs = [stack.enter_context(subprocess.Popen(
            [sys.executable, "-c", AT_ONCE, "keys", "add", name, "--file", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)) for name in names]
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
        outs = [(proc.stdout.read(), proc.stderr.read()) for proc in procs
                if proc.stdout is not None and proc.stderr is not None]
        for proc in procs:
            proc.wait(timeout=120)
    assert [proc.returncode for proc in procs] == [0] * 10, outs
    tenants = load_tenants(Settings(api_keys_file=str(path)))
    found = [tenants.find(out.strip()) for out, _ in outs]
    assert [t.name if t else None for t in found] == names
