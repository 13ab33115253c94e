"""SIGHUPs are coalesced (``cascade.http.reload.Reloader.reload``): a served process that gets 40
SIGHUPs while a reload runs runs one more reload after it, not 40."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.http.test_reload import ADMIN, policy_text
from tests.servers import free_port, wait_http


class Fifo(threading.Thread):
    """A named pipe at ``path`` that hands ``text`` to each reader while not ``held``: a
    reader (a reload reading the file) waits in ``open`` until then."""

    def __init__(self, path: Path, text: str) -> None:
        super().__init__(daemon=True)
        os.mkfifo(path)
        self.path, self.text = path, text.encode()
        self.held = threading.Lock()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            with self.held:
                fed = self._feed()
            self.stopping.wait(0.02 if fed else 0.005)

    def _feed(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody reads
            return False
        with contextlib.suppress(BrokenPipeError), os.fdopen(fd, "wb") as pipe:
            pipe.write(self.text)
        return True

    @contextlib.contextmanager
    def running(self) -> Iterator[Fifo]:
        self.start()
        try:
            yield self
        finally:
            self.stopping.set()
            self.join()


@contextlib.contextmanager
def served(
    cmd: list[str], url: str, log: Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_http(url + "/health", timeout_s=120, proc=proc)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_forty_sighups_during_a_reload_run_one_more_reload(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_text(0.0))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}
    # every reload line logged (the repeated-line limit would hide how many ran)
    env |= {
        "CASCADE_ADMIN_KEYS_FILE": str(tmp_path / "admin-keys"),
        "CASCADE_LOG_REPEAT_BURST": "1000",
    }
    cmd = [
        sys.executable,
        "-m",
        "cascade",
        "serve",
        "--policy",
        str(policy),
        "--port",
        str(port),
        "--log-level",
        "info",
    ]
    with (
        Fifo(tmp_path / "admin-keys", "admin-key\n").running() as fifo,
        served(cmd, url, log, env) as proc,
    ):
        with fifo.held:  # the first reload waits for the admin keys file; 39 more SIGHUPs come
            for _ in range(40):
                proc.send_signal(signal.SIGHUP)
                time.sleep(0.02)
            httpx.get(url + "/health", timeout=30)  # once answered, the loop has seen them all
        # a reload asked for now runs after what the signals queued: every reload has run then
        r = httpx.post(url + "/admin/reload", headers=ADMIN, timeout=300)
        assert r.status_code == 200, r.text
        lines = log.read_text(errors="replace")
    assert lines.count("SIGHUP: reloading") >= 30  # a few may merge in the kernel
    assert len(re.findall(r"reload (?:applied|unchanged):", lines)) <= 3, lines
