"""A real ``redis-server`` (Debian's package, installed by ``.ci/run``) for the tests: started on a free port in a
temporary directory, stopped, restarted on the same port, or paused (SIGSTOP) to play a slow Redis.

The fixtures are in ``conftest.py``: ``redis_url`` (one server per test session, emptied before each test) and
``redis_process`` (a server of the test's own, for the tests that stop it)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["REDIS_SERVER", "RedisProcess", "free_port"]

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisProcess:
    """One ``redis-server`` without persistence, listening on 127.0.0.1 only."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        assert REDIS_SERVER is not None
        self.directory = directory
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30.0) -> None:
        """Start it and return once it answers PING (it may take a moment on a busy machine)."""
        assert REDIS_SERVER is not None
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115  # the process writes it until stopped
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.directory / 'redis.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING")
            time.sleep(0.01)

    def answers(self) -> bool:
        """Whether it answers PING now (a raw RESP exchange: no client library needed)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Kill it (SIGKILL: Redis gone, as when its node dies) and wait for it."""
        if self.process is not None:
            if self.paused:
                self.resume()
            self.process.kill()
            self.process.wait()
            self.process = None

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing is answered, like a Redis stuck on a slow disk."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)
        self.paused = False

    def command(self, *args: str) -> bytes:
        """One command over a raw connection; its raw RESP answer."""
        parts = [f"*{len(args)}\r\n".encode()]
        for arg in args:
            data = arg.encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        with socket.create_connection(("127.0.0.1", self.port), timeout=5.0) as s:
            s.sendall(b"".join(parts))
            return s.recv(1 << 16)
