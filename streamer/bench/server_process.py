"""``streamer serve`` in its own process, for the benchmarks that measure the server as it is deployed (its memory
above all, which an in-process server would share with the clients).

:func:`running_server` starts the command, waits for ``/readyz`` and always stops the process on the way out
(SIGTERM, then SIGKILL after a grace period), on an error, Ctrl-C or SIGTERM alike. The server's output goes to a
temporary file, never to a pipe nobody reads (a full pipe would block its logging, and the server with it); its
tail is shown when the server dies or never gets ready. :func:`read_memory` reads a process's resident memory
from ``/proc``, :func:`read_cpu_seconds` the CPU time it has spent (Linux only).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from streamer.core.errors import StreamerError

__all__ = [
    "BYTES_PER_MB",
    "ProcessMemory",
    "ServerProcess",
    "children",
    "free_port",
    "free_ports",
    "read_cpu_seconds",
    "read_memory",
    "ready_workers",
    "running_redis",
    "running_server",
    "running_servers",
    "stop",
    "wait_ready",
    "wait_workers_ready",
]

BYTES_PER_MB = 1_000_000
KIB = 1024  # /proc/PID/status counts "kB" that are KiB
# how long the server gets to shut down gracefully after SIGTERM before it is killed
STOP_GRACE_SECONDS = 15.0
# lines of the server's log shown when it dies or never gets ready
LOG_TAIL_LINES = 30


@dataclass(frozen=True)
class ProcessMemory:
    """What ``/proc/PID/status`` says about a process's resident memory, in MB (10^6 bytes)."""

    rss_mb: float  # VmRSS: resident now
    hwm_mb: float  # VmHWM: the peak resident size since the process started


def read_memory(pid: int) -> ProcessMemory:
    """VmRSS and VmHWM of process ``pid``; raises OSError when it is gone."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * KIB / BYTES_PER_MB
    if len(values) < 2:
        raise OSError(f"no VmRSS/VmHWM for process {pid} (a zombie?)")
    return ProcessMemory(rss_mb=values["VmRSS"], hwm_mb=values["VmHWM"])


def read_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` and its live children (``streamer serve --workers``' workers) have
    spent, all their threads together (``/proc/PID/stat`` fields 14 and 15, in clock ticks); raises OSError when
    ``pid`` is gone."""
    total = _own_cpu_seconds(pid)
    for child in children(pid):
        with contextlib.suppress(OSError):  # a child that exited in between
            total += _own_cpu_seconds(child)
    return total


def _own_cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    # the command name (field 2) is in parentheses and may hold spaces: count the fields after its closing one
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15, 3 being the first after the name
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The live children of ``pid`` (field 4 of every ``/proc/PID/stat``, the parent's id)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii")
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            children.append(int(entry.name))
    return children


@dataclass(frozen=True)
class ServerProcess:
    """A running server: its process, the loopback port it listens on, and the file its output goes to."""

    process: subprocess.Popen[bytes]
    port: int
    log: IO[bytes]

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def memory(self) -> ProcessMemory:
        """The server's resident memory now; raises OSError when it is gone."""
        return read_memory(self.process.pid)

    def log_tail(self) -> str:
        """The last lines the server wrote."""
        return _tail(self.log)


def free_port() -> int:
    """A loopback port free at the time of the call (for the server's ``--port``)."""
    [port] = free_ports(1)
    return port


def free_ports(count: int) -> list[int]:
    """``count`` different loopback ports free at the time of the call (all held at once while they are chosen)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


def _tail(log: IO[bytes]) -> str:
    log.flush()
    log.seek(0)
    lines = log.read().decode("utf-8", "replace").splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:])


def wait_ready(server: subprocess.Popen[bytes], port: int, timeout: float, log: IO[bytes]) -> None:
    """Return once ``GET /readyz`` answers 200; raise with the log's tail if the server exits or takes too long."""
    deadline = time.monotonic() + timeout
    while True:
        code = server.poll()
        if code is not None:
            raise StreamerError(f"the server exited with code {code} before it was ready; its log ends:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):  # not listening yet, or 503 while the model loads
            pass
        if time.monotonic() > deadline:
            raise StreamerError(f"the server was not ready after {timeout:g} s; its log ends:\n{_tail(log)}")
        time.sleep(0.2)


def stop(*servers: subprocess.Popen[bytes]) -> None:
    """SIGTERM to every server still running (each drains and exits), then SIGKILL to any still there after the
    grace period (one grace period for all of them)."""
    running = [server for server in servers if server.poll() is None]
    for server in running:
        server.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for server in running:
        try:
            server.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@contextlib.contextmanager
def _terminated_by_exception() -> Iterator[None]:
    """SIGTERM raises SystemExit while inside, so ``finally`` blocks (the server's stop) run as on Ctrl-C."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def running_server(command: Sequence[str], port: int, ready_timeout: float) -> Iterator[ServerProcess]:
    """Start ``command`` (a server listening on ``port``), wait until it is ready, and stop it on the way out.

    Raises :class:`~streamer.core.errors.StreamerError` with the server's last lines when it exits before it is ready
    or is not ready after ``ready_timeout`` seconds.
    """
    with running_servers([(command, port)], ready_timeout) as [server]:
        yield server


@contextlib.contextmanager
def running_servers(
    commands: Sequence[tuple[Sequence[str], int]], ready_timeout: float
) -> Iterator[list[ServerProcess]]:
    """Start every ``(command, port)`` server at once (their start-ups, a model's load included, overlap), wait
    until each is ready, and stop them all on the way out, as :func:`running_server` does one."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_terminated_by_exception())
        servers: list[ServerProcess] = []
        stack.callback(lambda: stop(*(server.process for server in servers)))
        for command, port in commands:
            print(f"starting the server: {' '.join(command)}", file=sys.stderr)
            log = stack.enter_context(tempfile.TemporaryFile(prefix="streamer-server-"))
            servers.append(
                ServerProcess(subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT), port, log)
            )
        for server in servers:
            wait_ready(server.process, server.port, ready_timeout, server.log)
        yield servers


def wait_workers_ready(server: ServerProcess, workers: int, timeout: float) -> None:
    """Return once every one of the server's ``workers`` (``streamer serve --workers``) says it is ready on
    ``/metrics`` (``streamer_ready`` of each ``worker``: its model loaded), so that a step's streams are spread over
    them all; at once for a plain server."""
    if workers <= 1:
        return
    deadline = time.monotonic() + timeout
    while True:
        ready = ready_workers(server.port)
        if ready >= workers:
            return
        if server.process.poll() is not None or time.monotonic() > deadline:
            raise StreamerError(f"{ready:g} of {workers} workers ready; the server's log ends:\n{server.log_tail()}")
        time.sleep(0.2)


def ready_workers(port: int) -> float:
    """How many workers of the server on ``port`` (``streamer serve --workers``) say they are ready on ``/metrics``:
    the sum of ``streamer_ready`` over its ``worker`` labels. Raises OSError while nothing answers there."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode("utf-8")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("streamer_ready{"))


@contextlib.contextmanager
def running_redis(ready_timeout: float = 30.0) -> Iterator[str]:
    """A ``redis-server`` of the bench's own (no persistence, loopback only, a free port) for servers with
    ``--workers``; its URL. Stopped on the way out."""
    executable = shutil.which("redis-server")
    if executable is None:
        raise StreamerError("redis-server is not on the PATH")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="streamer-redis-") as directory:
        command = [executable, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", ""]
        command += ["--appendonly", "no", "--protected-mode", "no"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + ready_timeout
            while not _answers_ping(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise StreamerError("redis-server did not start")
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            stop(process)


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(64).startswith(b"+PONG")
    except OSError:
        return False
