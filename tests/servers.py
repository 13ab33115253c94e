"""Start real servers on loopback for tests: our app under uvicorn, any command, Prometheus; read
a request on a scripted asyncio server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """A request's head (up to its blank line) and its ``Content-Length`` body, from a
    scripted server's stream."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serve_app(
    app: Any,
    *,
    timeout_s: float = 60.0,
    server_class: Callable[[uvicorn.Config], uvicorn.Server] = uvicorn.Server,
    **options: Any,
) -> Iterator[str]:
    """Run an ASGI app under uvicorn in a thread on 127.0.0.1; yield its base URL.
    ``server_class``: the server (or a factory of one); ``options``: more ``uvicorn.Config``
    arguments (``http=`` a protocol class)."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", **options
    )
    server = server_class(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def wait_http(url: str, *, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``url`` until it answers (any status), the process dies, or the timeout passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


@contextlib.contextmanager
def run_process(
    cmd: Sequence[str],
    *,
    ready_url: str,
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
    log_path: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``cmd``, wait until ``ready_url`` answers, and always stop it afterwards; its
    output goes to ``log_path`` when given (for the test to read), else a temporary file."""
    log = open(log_path, "w+b") if log_path else tempfile.TemporaryFile()  # noqa: SIM115
    proc = subprocess.Popen(list(cmd), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            wait_http(ready_url, timeout_s=timeout_s, proc=proc)
        except (RuntimeError, TimeoutError) as exc:
            proc.kill()
            log.seek(0)
            out = log.read().decode(errors="replace")
            raise RuntimeError(f"{cmd[0]} failed to start: {exc}\n{out[-4000:]}") from exc
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def require_tool(name: str) -> str:
    """The path of a system tool the tests start; a missing one is an error, never a skip
    (``.ci/run`` installs them)."""
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(
            f"{name} is not installed; .ci/run installs it (see docs/development.md)"
        )
    return path


@contextlib.contextmanager
def run_prometheus(config: Path, workdir: Path, *, timeout_s: float = 60.0) -> Iterator[str]:
    """Debian's ``prometheus`` on a free loopback port with ``config``; yield its base URL.

    Its TSDB lives in ``workdir``; it is stopped on exit.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        require_tool("prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with run_process(cmd, ready_url=url + "/-/ready", timeout_s=timeout_s):
        yield url


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a server's ``/metrics``: ``{(name, labels): value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@contextlib.contextmanager
def run_redis(
    *, timeout_s: float = 20.0, port: int | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Debian's ``redis-server`` on a free loopback port (or ``port``: a restart), no
    persistence; yield its URL and process (tests pause it with SIGSTOP). Always stopped (and
    resumed first) on exit."""
    import signal

    port = port or free_port()
    cmd = [
        require_tool("redis-server"),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--loglevel",
        "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Postgres:
    """Debian's PostgreSQL (``/usr/lib/postgresql/*/bin``) in a temporary data directory, run as
    the ``postgres`` system user (it refuses root) on a free loopback port and a private socket
    directory; ``stop`` (by PID, a fast shutdown) and ``start`` again keep its data. ``url`` of
    a database: ``database(name)`` creates it."""

    def __init__(self, root: Path) -> None:
        import glob

        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
        if not found:
            raise RuntimeError("PostgreSQL is not installed; tests/system-tools.sh installs it")
        self.bin = Path(found[-1]).parent
        self.root, self.port = root, free_port()
        self.data, self.sockets = root / "data", root / "sockets"
        self.sockets.mkdir(parents=True)
        shutil.chown(root, "postgres")
        shutil.chown(self.sockets, "postgres")
        self.proc: subprocess.Popen[bytes] | None = None
        self._as_postgres(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        )

    def _as_postgres(self, *cmd: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *cmd],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, timeout_s: float = 30.0) -> None:
        self.proc = subprocess.Popen(
            [
                "runuser",
                "-u",
                "postgres",
                "--",
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.sockets),
                "-h",
                "127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("postgres did not start")
            time.sleep(0.05)
        import psycopg

        while True:  # the port opens before the server takes connections
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        """A fast shutdown by the server's PID (runuser's child), waited for."""
        import signal

        if self.proc is None or self.proc.poll() is not None:
            return
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def database(self, name: str) -> str:
        """A fresh database ``name`` (dropped first if there); its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@contextlib.contextmanager
def run_postgres() -> Iterator[Postgres]:
    """A started ``Postgres``, always stopped and its directory removed on exit."""
    root = Path(tempfile.mkdtemp(prefix="cascade-pg-"))
    try:
        server = Postgres(root)
        server.start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
