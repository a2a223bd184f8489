"""The benchmarks' server in its own process: memory from /proc, readiness, a clear error when it dies, and a stop
that cannot hang."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import pytest

from streamer.bench import server_process
from streamer.bench.server_process import (
    free_port,
    free_ports,
    read_cpu_seconds,
    read_memory,
    running_server,
    running_servers,
    stop,
    wait_ready,
)
from streamer.core.errors import StreamerError


def _python(code: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)


def test_read_memory_of_a_live_process() -> None:
    memory = read_memory(os.getpid())
    assert 1 < memory.rss_mb <= memory.hwm_mb
    with pytest.raises(OSError):
        read_memory(2**22 + 12345)  # above the kernel's pid_max


def test_read_cpu_seconds_of_a_live_process_counts_its_work() -> None:
    before = read_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # spend 50 ms of CPU (the process's clock, not the wall's)
        pass
    assert read_cpu_seconds(os.getpid()) >= before + 0.03  # the kernel counts in ticks of 10 ms
    with pytest.raises(OSError):
        read_cpu_seconds(2**22 + 12345)


def test_a_server_that_dies_while_loading_is_reported_with_its_log() -> None:
    with tempfile.TemporaryFile() as log:
        server = _python("print('cannot load the model'); raise SystemExit(3)", log)
        with pytest.raises(StreamerError, match=r"exited with code 3 .*\n.*cannot load the model"):
            wait_ready(server, free_port(), 30, log)


def test_a_server_that_never_gets_ready_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryFile() as log:
        server = _python("import time; print('loading', flush=True); time.sleep(60)", log)
        try:
            with pytest.raises(StreamerError, match=r"not ready after 0.5 s"):
                wait_ready(server, free_port(), 0.5, log)
        finally:
            stop(server)


def test_a_server_that_ignores_sigterm_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_process, "STOP_GRACE_SECONDS", 0.5)
    with tempfile.TemporaryFile() as log:
        server = _python(
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
            "time.sleep(60)",
            log,
        )
        deadline = time.monotonic() + 60  # a hang guard
        while b"up" not in Path(f"/proc/self/fd/{log.fileno()}").read_bytes():  # its SIGTERM handler is set
            assert server.poll() is None and time.monotonic() < deadline, "the stand-in did not start"
            time.sleep(0.05)
        stop(server)
        # killed (SIGKILL after the grace period), not waited for: it would have slept 60 s and exited 0
        assert server.returncode == -9


def _ready_stand_in(port: int) -> list[str]:
    """A stand-in for streamer serve: answers /readyz until SIGTERM."""
    code = (
        "import http.server, sys\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(b'ready')\n"
        "    def log_message(self, *a): pass\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    return [sys.executable, "-c", code]


def test_running_server_serves_then_stops_even_on_an_error() -> None:
    port = free_port()
    with (
        pytest.raises(RuntimeError, match="the benchmark failed"),
        running_server(_ready_stand_in(port), port, 30) as server,
    ):
        assert server.url == f"ws://127.0.0.1:{port}"
        assert server.memory().rss_mb > 1
        process = server.process
        raise RuntimeError("the benchmark failed")
    assert process.poll() is not None  # stopped on the way out


def test_free_ports_are_all_different() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8 and all(port > 0 for port in ports)


def test_running_servers_serve_together_and_all_stop_when_one_never_gets_ready() -> None:
    first, second = free_ports(2)
    with running_servers([(_ready_stand_in(first), first), (_ready_stand_in(second), second)], 30) as servers:
        assert [s.url for s in servers] == [f"ws://127.0.0.1:{first}", f"ws://127.0.0.1:{second}"]
        processes = [s.process for s in servers]
        assert all(p.poll() is None for p in processes)
    assert all(p.poll() is not None for p in processes)  # both stopped on the way out
    dying = [sys.executable, "-c", "print('no model here'); raise SystemExit(3)"]
    started: list[subprocess.Popen[bytes]] = []
    original = subprocess.Popen
    with (
        pytest.MonkeyPatch.context() as patch,
        pytest.raises(StreamerError, match=r"exited with code 3 .*\n.*no model here"),
    ):
        patch.setattr(subprocess, "Popen", lambda *a, **k: started.append(original(*a, **k)) or started[-1])
        with running_servers([(_ready_stand_in(first), first), (dying, second)], 30):
            pass
    assert len(started) == 2 and started[0].poll() is not None  # the ready one was stopped too


def test_stopping_several_servers_kills_those_that_ignore_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_process, "STOP_GRACE_SECONDS", 0.5)
    with tempfile.TemporaryFile() as first_log, tempfile.TemporaryFile() as second_log:
        stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
        servers = [_python(stubborn + "time.sleep(60)", first_log), _python("import time; time.sleep(60)", second_log)]
        deadline = time.monotonic() + 60  # a hang guard
        while b"up" not in Path(f"/proc/self/fd/{first_log.fileno()}").read_bytes():
            assert servers[0].poll() is None and time.monotonic() < deadline, "the stand-in did not start"
            time.sleep(0.05)
        stop(*servers)
        assert servers[0].returncode == -9  # killed after the grace period
        assert servers[1].returncode == -15  # ended by its SIGTERM
