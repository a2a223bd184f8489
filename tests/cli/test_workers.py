"""``streamer serve --workers N`` (:mod:`streamer.cli.workers`): N servers on one port under a supervisor, each
worker's command line and threads, the Redis they need, a dead worker started again, and a drain on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from streamer.bench.harness import stream_file
from streamer.bench.server_process import children, free_port, running_server, wait_workers_ready
from streamer.cli.serve import config_from_args, configure_parser
from streamer.cli.workers import WorkerThreads, worker_command, worker_place_from, worker_threads
from streamer.core.errors import ConfigError
from streamer.core.units import SAMPLE_RATE
from streamer.engine.fake import STEADY_WORDS, synthetic_silence, synthetic_voice
from tests.redis_server import REDIS_SERVER


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    return parser.parse_args(list(argv))


def test_each_worker_shares_the_cores_by_load_unless_told_its_threads() -> None:
    assert worker_threads(2, None, cores=2) == WorkerThreads(1, 2)
    assert worker_threads(2, None, cores=16) == WorkerThreads(8, 16)
    assert worker_threads(3, None, cores=2) == WorkerThreads(1, 2)  # never none
    assert worker_threads(2, 3, cores=16) == WorkerThreads(3, None)  # the operator's, fixed
    command = worker_command(["-v", "serve", "--workers", "2"], 1, 7, Path("/tmp/w"), WorkerThreads(4, 8))
    place = ["--worker-index", "1", "--listen-fd", "7", "--worker-dir", "/tmp/w"]
    shared = ["--threads", "4", "--worker-cores", "8"]
    assert command[1:] == ["-m", "streamer", "-v", "serve", "--workers", "2", *place, *shared]
    fixed = worker_command(["serve", "--threads", "3"], 0, 7, Path("/tmp/w"), WorkerThreads(3, None))
    assert fixed.count("--threads") == 1 and "--worker-cores" not in fixed


def test_several_workers_need_the_redis_they_share_as_replicas_do() -> None:
    with pytest.raises(ConfigError, match="--workers above 1 needs --redis"):
        config_from_args(parse("--workers", "2"))
    with pytest.raises(ConfigError, match="at least 1"):
        config_from_args(parse("--workers", "0"))
    assert config_from_args(parse("--workers", "2", "--redis", "redis://127.0.0.1:1/0")).worker is None


def test_a_worker_reads_its_place_from_all_three_hidden_options(tmp_path: Path) -> None:
    worker = ("--workers", "2", "--redis", "redis://127.0.0.1:1/0", "--worker-index", "1", "--listen-fd", "9")
    config = config_from_args(parse(*worker, "--worker-dir", str(tmp_path)))
    assert config.listen_fd == 9 and config.worker is not None
    assert (config.worker.index, config.worker.workers, config.worker.directory) == (1, 2, tmp_path)
    assert config.worker.cores is None  # the operator's --threads, fixed
    shared = config_from_args(parse(*worker, "--worker-dir", str(tmp_path), "--worker-cores", "2"))
    assert shared.worker is not None and shared.worker.cores == 2
    with pytest.raises(ConfigError, match="cores must be at least 1"):
        config_from_args(parse(*worker, "--worker-dir", str(tmp_path), "--worker-cores", "0"))
    with pytest.raises(ConfigError, match="needs all of"):
        worker_place_from(parse(*worker))
    with pytest.raises(ConfigError, match="index must be between 0 and 1"):
        config_from_args(parse(*worker[:5], "2", "--listen-fd", "9", "--worker-dir", str(tmp_path)))


def sessions_by_worker(port: int) -> dict[str, float]:
    """The /v1/listen sessions each of two workers has accepted, from the server's /metrics."""
    sessions = metric(port, "streamer_sessions_total")
    return {w: sessions.get(f'{{worker="{w}",route="listen"}}', 0.0) for w in ("0", "1")}


def metric(port: int, name: str) -> dict[str, float]:
    """``name``'s samples by their labels' text, from the server's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line[len(name) :].rpartition(" ")
            samples[labels] = float(value)
    return samples


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed (.ci/run installs it)")
def test_workers_serve_on_one_port_restart_when_killed_and_drain_on_sigterm(redis_url: str) -> None:
    port = free_port()
    command = [sys.executable, "-m", "streamer", "serve", "--engine", "scripted", "--port", str(port)]
    command += ["--workers", "2", "--redis", redis_url, "--threads", "1", "--max-audio-rate", "0"]
    command += ["--scripted-window-ms", "1", "--scripted-batch-ms", "1"]
    speech = np.concatenate([synthetic_voice(3 * SAMPLE_RATE), synthetic_silence(2 * SAMPLE_RATE)])
    with running_server(command, port, ready_timeout=120) as server:
        wait_workers_ready(server, 2, timeout=120)
        pids = children(server.process.pid)
        assert len(pids) == 2

        # streams through the one port, spread over both workers
        async def two() -> list[object]:
            return list(
                await asyncio.gather(
                    *(stream_file(server.url, f"voice {i}", speech, speed=5, chunk_ms=100) for i in range(4))
                )
            )

        for run in asyncio.run(two()):
            assert run.errors == () and run.done is not None and run.done.lost_seconds == 0  # type: ignore[attr-defined]
            assert run.finals and set(run.text.split()) <= set(STEADY_WORDS)  # type: ignore[attr-defined]
        # any worker's /metrics has both: its own read now, its sibling's as of that one's last snapshot (a second)
        deadline = time.monotonic() + 60
        while sum((by_worker := sessions_by_worker(port)).values()) < 4:
            assert time.monotonic() < deadline, by_worker
            time.sleep(0.1)
        assert sum(by_worker.values()) == 4 and all(count >= 1 for count in by_worker.values()), by_worker
        # a killed worker is started again, and the port serves throughout
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while not (len(now := children(server.process.pid)) == 2 and pids[0] not in now):
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.1)
        wait_workers_ready(server, 2, timeout=120)
        run = asyncio.run(stream_file(server.url, "voice", speech, speed=5, chunk_ms=100))
        assert run.errors == () and run.done is not None and run.finals
        # SIGTERM drains every worker, and the supervisor exits 0 once they all have
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(timeout=120)
        log = server.log_tail()
    assert code == 0, log
    assert "worker 0 exited with -9; starting it again" in log and "shutting down the workers" in log
    assert log.count("streamer: shutting down") == 3  # the supervisor's line and each worker's


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed (.ci/run installs it)")
def test_workers_whose_supervisor_is_killed_drain_and_exit(redis_url: str) -> None:
    port = free_port()
    command = [sys.executable, "-m", "streamer", "serve", "--engine", "scripted", "--port", str(port)]
    command += ["--workers", "2", "--redis", redis_url, "--threads", "1"]
    with running_server(command, port, ready_timeout=120) as server:
        wait_workers_ready(server, 2, timeout=120)
        pids = children(server.process.pid)
        assert len(pids) == 2
        server.process.kill()
        server.process.wait()
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in pids):
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.1)
        log = server.log_tail()
    assert log.count("event=supervisor_gone") == 2, log  # each drained on its own


def _state(pid: int) -> str:
    """The process's state letter from /proc (Z: a zombie, exited and not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "Z"
    return stat[stat.rindex(")") + 2]
