"""The file watcher (``cascade.fleet.watch``): ``Settle`` fires once a change holds still for one
look; the thread sees a ConfigMap's symlink swap and an edit in place, once each."""

from __future__ import annotations

import threading
from pathlib import Path

from cascade.fleet.watch import Settle, Watcher, look
from tests.fleet.configmap import ConfigMap


def test_settle_fires_once_a_change_holds_still_for_one_look() -> None:
    a, b, c = ((("f", "/x", 1, 1, 1),), (("f", "/y", 2, 1, 1),), (("f", "/z", 3, 1, 1),))
    settle = Settle(a)
    assert [settle.see(x) for x in (a, b, c, c, c)] == [False, False, False, True, False]
    assert settle.see(a) is False and settle.see(a) is True  # back to a: a change again
    assert [settle.see(x) for x in (b, a, a)] == [False, False, False]  # b never held still


def test_a_configmap_swap_changes_the_look_though_the_path_stays(tmp_path: Path) -> None:
    volume = ConfigMap(tmp_path / "config", {"policy.toml": "a = 1\n"})
    path = str(volume.path("policy.toml"))
    before = look([path])
    volume.update({"policy.toml": "a = 1\n"})  # the same text: only the target moves
    after = look([path])
    assert before != after and before[0][1] != after[0][1]
    assert look([str(tmp_path / "missing")]) == ((str(tmp_path / "missing"), "", 0, 0, 0),)


class Calls:
    """Counts ``on_change`` calls; ``wait_for(n)`` waits (bounded) until there are ``n``."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = threading.Condition()

    def __call__(self) -> None:
        with self._changed:
            self.count += 1
            self._changed.notify_all()

    def wait_for(self, n: int, timeout_s: float = 10.0) -> int:
        with self._changed:
            self._changed.wait_for(lambda: self.count >= n, timeout=timeout_s)
            return self.count


def test_the_thread_reloads_once_per_configmap_swap_and_per_edit(tmp_path: Path) -> None:
    volume = ConfigMap(tmp_path / "config", {"policy.toml": "a = 1\n", "keys": "k\n"})
    plain = tmp_path / "admin-keys"
    plain.write_text("admin\n")
    calls = Calls()
    paths = [str(volume.path("policy.toml")), str(volume.path("keys")), str(plain)]
    watcher = Watcher(lambda: paths, calls, interval_s=0.02)
    watcher.start()
    try:
        volume.update({"policy.toml": "a = 2\n", "keys": "k\n"})
        assert calls.wait_for(1) == 1
        plain.write_text("admin\nsecond\n")
        assert calls.wait_for(2) == 2
        volume.update({"policy.toml": "a = 2\n", "keys": "k2\n"})
        assert calls.wait_for(3) == 3
        # nothing changes for a while: no more calls (a count past 3 would show up here)
        assert calls.wait_for(4, timeout_s=0.3) == 3
    finally:
        watcher.stop()
