"""A benchmark's server as ``streamer serve --workers N`` runs it: N worker processes on one port, each with its own
engine, taking connections in turn by load (:mod:`streamer.server.balance`), for ``streamer bench accuracy --mode
realtime --workers N`` (issue 39: whether a two-core machine holds eight streams better with two single-thread engines
than with one two-thread engine).

:func:`worker_pool` binds the socket, writes the server's configuration and the engine's choice to a file, starts
the workers (``python -m streamer.bench.workers FILE INDEX FD``: the same :class:`~streamer.server.serve.ServerConfig`
the in-process bench serves, not a command line rebuilt from it), waits until all of them are ready, and on the way out
stops them (SIGTERM: each drains as ``streamer serve`` does) and hands each one's decode records to the bench's
recorder, so that the pass's engine figures cover every worker. Without Redis: the benchmark's clients never resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from streamer.bench.harness import DecodeRecord, RecordingEngine
from streamer.bench.server_process import ready_workers, stop
from streamer.cli.event_loop import run_event_loop
from streamer.cli.workers import WorkerThreads
from streamer.core.errors import StreamerError
from streamer.server.balance import WorkerBoard, WorkerPlace
from streamer.server.serve import ServerConfig

__all__ = ["WorkerPool", "WorkerSpec", "worker_pool"]

# the file each worker leaves its decode records in, beside the board
RECORDS = "records-{index}.pickle"


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker serves: the configuration (its listen_fd and worker filled in by each), and the engine."""

    config: ServerConfig
    model: str
    engine_config: str  # a name in streamer.engine.CONFIGS
    threads: WorkerThreads


@dataclass(frozen=True)
class WorkerPool:
    """The running workers: the port they share."""

    port: int
    processes: tuple[subprocess.Popen[bytes], ...]


@contextlib.contextmanager
def worker_pool(
    spec: WorkerSpec, workers: int, recorder: RecordingEngine, ready_timeout: float = 300.0
) -> Iterator[WorkerPool]:
    """``workers`` workers serving ``spec`` on a free loopback port; stopped on the way out, their decode records added
    to ``recorder``."""
    shared = socket.create_server(("127.0.0.1", 0), backlog=1024)
    shared.set_inheritable(True)
    with shared, tempfile.TemporaryDirectory(prefix="streamer-bench-workers-") as name:
        directory = Path(name)
        board = WorkerBoard.create(WorkerPlace(0, workers, directory).board, workers)
        spec_file = directory / "spec.pickle"
        spec_file.write_bytes(pickle.dumps(spec))
        logs = [open(directory / f"worker-{i}.log", "wb+") for i in range(workers)]  # noqa: SIM115
        processes: list[subprocess.Popen[bytes]] = []
        try:
            for index in range(workers):
                command = [sys.executable, "-m", "streamer.bench.workers", str(spec_file), str(index)]
                command += [str(workers), str(shared.fileno())]
                processes.append(
                    subprocess.Popen(command, pass_fds=(shared.fileno(),), stdout=logs[index], stderr=subprocess.STDOUT)
                )
            port = int(shared.getsockname()[1])
            _wait_ready(port, processes, workers, ready_timeout, logs)
            yield WorkerPool(port, tuple(processes))
        finally:
            stop(*processes)
            for index in range(workers):
                records = directory / RECORDS.format(index=index)
                if records.exists():
                    recorder.add(pickle.loads(records.read_bytes()))
            for log in logs:
                log.close()
            board.close()


def _wait_ready(
    port: int, processes: Sequence[subprocess.Popen[bytes]], workers: int, timeout: float, logs: Sequence[IO[bytes]]
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ready = 0.0
        with contextlib.suppress(OSError):  # not listening yet
            ready = ready_workers(port)
        if ready >= workers:
            return
        dead = [p.returncode for p in processes if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tails = []
            for log in logs:
                log.seek(0)
                tails.append(log.read().decode("utf-8", "replace")[-2000:])
            raise StreamerError(
                f"{ready:g} of {workers} workers ready (exits: {dead}); their logs end:\n" + "\n".join(tails)
            )
        time.sleep(0.2)


async def _serve(spec: WorkerSpec, place: WorkerPlace, fd: int) -> None:
    from streamer.app import App
    from streamer.engine import CONFIGS, load_engine

    engine = RecordingEngine(
        load_engine(spec.model, dataclasses.replace(CONFIGS[spec.engine_config], threads=spec.threads.threads))
    )
    config = dataclasses.replace(spec.config, listen_fd=fd, worker=place)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        async with App(config, engine):
            await stopping.wait()
    finally:
        engine.close()
        records: list[DecodeRecord] = engine.take()
        (place.directory / RECORDS.format(index=place.index)).write_bytes(pickle.dumps(records))


def main(argv: list[str]) -> int:
    """A worker: ``SPEC_FILE INDEX WORKERS FD``."""
    spec_file, index, workers, fd = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    spec: WorkerSpec = pickle.loads(spec_file.read_bytes())
    place = WorkerPlace(index, workers, spec_file.parent, spec.threads.cores)
    run_event_loop(_serve(spec, place, fd))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
