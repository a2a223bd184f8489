"""Several ``streamer serve`` replicas behind HAProxy, sharing a real ``redis-server``: the deployment of
``docker/k8s/`` on one machine, for tests/reliability/test_replicas.py.

:class:`Cluster` starts the replicas (the real command, ``python -m streamer serve --redis URL``, each its own
process), writes an HAProxy configuration into its directory (round-robin, no stickiness, WebSocket upgrades
passed through, a failed connect sent to another replica) and starts ``haproxy`` in the foreground. The test then
talks to :attr:`Cluster.url` as a client would to a Kubernetes Service, kills a replica with SIGKILL
(:meth:`Cluster.kill`), brings it back (:meth:`Cluster.restart`), and stops or restarts Redis through the
:class:`~tests.redis_server.RedisProcess` it was given. Every process's output goes to a file in the directory,
whose tail is shown when one fails to start.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.redis_server import RedisProcess, free_port

__all__ = ["HAPROXY", "Cluster", "Replica", "haproxy_config"]

HAPROXY = shutil.which("haproxy")
REPO = Path(__file__).resolve().parents[2]
# how long a replica may take to load its model and answer /readyz on a busy 2-core machine
READY_TIMEOUT_S = 180.0


def haproxy_config(port: int, replicas: Sequence[int], stats_socket: Path) -> str:
    """An HAProxy configuration: ``127.0.0.1:port`` spread round-robin over the ``replicas`` ports.

    No stickiness (no cookie, no source hash): a reconnect may land on any replica, as behind a Kubernetes Service
    without session affinity. A WebSocket is an HTTP/1.1 upgrade, which HAProxy passes through in ``mode http``;
    ``timeout tunnel`` then governs the open connection. Health checks on ``/healthz`` every 200 ms take a dead
    replica out after two misses; until then ``retries`` with ``option redispatch`` send a connection that a dead
    replica refuses to another one."""
    servers = "\n".join(
        f"    server r{index} 127.0.0.1:{backend} check inter 200ms fall 2 rise 1"
        for index, backend in enumerate(replicas)
    )
    return f"""global
    maxconn 512
    stats socket {stats_socket} mode 600 level admin

defaults
    mode http
    log global
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout tunnel 1h
    retries 3
    option redispatch 1

frontend streams
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /healthz
{servers}
"""


@dataclass
class Replica:
    """One ``streamer serve`` process (None while it is down) on a fixed port, so that it comes back there."""

    index: int
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class Cluster:
    """``len(ports)`` replicas of ``streamer serve ARGS --redis REDIS`` behind one HAProxy. Use as a context
    manager: everything is started on entry and stopped on exit."""

    def __init__(
        self, directory: Path, redis: RedisProcess, args: Sequence[str], env: dict[str, str], replicas: int = 3
    ) -> None:
        self.directory = directory
        self.redis = redis
        self.args = list(args)
        self.env = {**os.environ, **env}
        self.replicas = [Replica(i, free_port(), directory / f"replica-{i}.log") for i in range(replicas)]
        self.port = free_port()
        self.stats_socket = directory / "haproxy.sock"
        self._haproxy: subprocess.Popen[bytes] | None = None
        self._haproxy_log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """What clients connect to: the proxy."""
        return f"ws://127.0.0.1:{self.port}"

    def __enter__(self) -> Cluster:
        try:
            for replica in self.replicas:  # all load their model at once
                self._spawn(replica)
            for replica in self.replicas:
                self._wait_ready(replica)
            self._start_haproxy()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._haproxy is not None:
            self._haproxy.terminate()
            self._haproxy.wait(10)
            self._haproxy = None
        if self._haproxy_log is not None:
            self._haproxy_log.close()
        for replica in self.replicas:
            self._stop(replica)

    # -- replicas ------------------------------------------------------------------------------------------------------

    def kill(self, index: int) -> None:
        """SIGKILL replica ``index``, as when its node dies: no drain, no goodbye to its clients or to Redis."""
        replica = self.replicas[index]
        assert replica.process is not None
        replica.process.send_signal(signal.SIGKILL)
        replica.process.wait()
        replica.process = None

    def restart(self, index: int) -> None:
        """Start replica ``index`` again on its port; return once HAProxy sends it connections again."""
        replica = self.replicas[index]
        self._spawn(replica)
        self._wait_ready(replica)
        deadline = time.monotonic() + 30
        while self.backend_states().get(f"r{index}") != "UP":
            if time.monotonic() > deadline:
                raise RuntimeError(f"HAProxy does not see replica {index} up: {self.backend_states()}")
            time.sleep(0.05)

    def backend_states(self) -> dict[str, str]:
        """Each replica's state as HAProxy's health checks see it (``r0``: ``UP``, ``DOWN``, ...)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stats:
            stats.connect(str(self.stats_socket))
            stats.sendall(b"show stat\n")
            raw = b""
            while chunk := stats.recv(65536):
                raw += chunk
        lines = raw.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {row["svname"]: row["status"] for row in rows if row.get("pxname") == "replicas"}

    def _spawn(self, replica: Replica) -> None:
        command = [sys.executable, "-m", "streamer", "-v", "serve", "--port", str(replica.port), *self.args]
        command += ["--redis", self.redis.url]
        with open(replica.log_path, "ab") as log:  # the child keeps its own descriptor
            replica.process = subprocess.Popen(command, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def _wait_ready(self, replica: Replica) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _answers(f"http://127.0.0.1:{replica.port}/readyz"):
            assert replica.process is not None
            if replica.process.poll() is not None:
                raise RuntimeError(f"replica {replica.index} exited; its log ends:\n{replica.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {replica.index} was not ready; its log ends:\n{replica.log_tail()}")
            time.sleep(0.1)

    @staticmethod
    def _stop(replica: Replica) -> None:
        if replica.process is None:
            return
        replica.process.terminate()
        try:
            replica.process.wait(15)
        except subprocess.TimeoutExpired:
            replica.process.kill()
            replica.process.wait()
        replica.process = None

    # -- the proxy -----------------------------------------------------------------------------------------------------

    def _start_haproxy(self) -> None:
        assert HAPROXY is not None
        config = self.directory / "haproxy.cfg"
        config.write_text(haproxy_config(self.port, [r.port for r in self.replicas], self.stats_socket))
        self._haproxy_log = open(self.directory / "haproxy.log", "ab")  # noqa: SIM115  # open while it runs
        # -db: stay in the foreground (no daemon), so that the fixture owns the process and stops it
        self._haproxy = subprocess.Popen(
            [HAPROXY, "-db", "-f", str(config)], stdout=self._haproxy_log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 30
        while not (_answers(f"http://127.0.0.1:{self.port}/healthz") and self._all_up()):
            if self._haproxy.poll() is not None or time.monotonic() > deadline:
                log = (self.directory / "haproxy.log").read_text(errors="replace")
                raise RuntimeError(f"haproxy did not start: {log[-2000:]}")
            time.sleep(0.05)

    def _all_up(self) -> bool:
        try:
            return set(self.backend_states().values()) == {"UP"}
        except OSError:
            return False


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
