"""``streamer serve --workers N``: N server processes on one listening port, each with its own engine (the model once
in each), supervised by the process the operator started.

Why: one Python process carries one event loop and one engine thread. On a CPU a model's passes keep two cores only
partly busy (the decoder's single-token passes are per-operator overhead on one core), and on a GPU one process
stops feeding the device long before the device is full. Workers are replicas of ``streamer serve`` behind no proxy:

- The supervisor binds ``--host:--port`` once and hands the socket to every worker; the workers take turns to accept
  by their load (:mod:`streamer.server.balance`: the least-loaded ready worker listens), so eight streams over two
  workers split four and four.
- What replicas share, workers share the same way: a session's resume, call followers and single-use browser tokens
  go through ``--redis`` (required with more than one worker: without it, a client resuming would reach another
  worker that knows nothing of its session).
- ``/metrics`` on any worker answers for all of them, each sample labelled ``worker`` (``sum by (...)`` for the
  whole server); ``/status``, ``/healthz`` and ``/readyz`` answer for the worker that took the request.
- ``--threads`` is each worker's; without it, the cores this process may run on are shared out by load: each engine
  call runs on the cores divided among the workers carrying connections then (one stream alone gets them all, eight
  over two workers on two cores one each; :func:`streamer.server.balance.engine_threads`).
- A worker that dies is started again (after 1 s, doubling to 30 s while it keeps dying within a minute of its start);
  SIGTERM or SIGINT to the supervisor drains every worker as one ``streamer serve`` drains, and the supervisor exits
  once they all have (1 if any failed).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from streamer.core.errors import ConfigError
from streamer.engine.kernels import available_cores
from streamer.server.balance import STOPPED, WorkerBoard, WorkerPlace, metrics_snapshot
from streamer.server.listen_query import LISTEN_PATH

__all__ = ["WORKER_FLAGS", "Supervisor", "WorkerThreads", "worker_command", "worker_place_from", "worker_threads"]

logger = logging.getLogger(__name__)

# the options the supervisor adds to a worker's command line (hidden from --help)
WORKER_FLAGS = ("--worker-index", "--listen-fd", "--worker-dir")
# a worker that dies is started again after this long, doubling while it dies within RESTART_RESET_SECONDS of its start
RESTART_FIRST_SECONDS = 1.0
RESTART_MAX_SECONDS = 30.0
RESTART_RESET_SECONDS = 60.0
# how often the supervisor looks at its workers
POLL_SECONDS = 0.1
# listening socket's backlog: every worker accepts from it
BACKLOG = 1024


@dataclass(frozen=True)
class WorkerThreads:
    """Each worker's engine threads: ``threads`` to start with, and the ``cores`` its engine calls share with its
    siblings' by load from then on (None: ``threads`` throughout, as the operator's ``--threads`` fixes them)."""

    threads: int
    cores: int | None


def worker_threads(workers: int, threads: int | None, cores: int | None = None) -> WorkerThreads:
    """The operator's ``--threads`` for every worker, fixed; else the cores this process may run on (or ``cores``),
    shared out by load, each worker starting on its even share."""
    if threads is not None:
        return WorkerThreads(threads, None)
    if cores is None:
        cores = available_cores()
    return WorkerThreads(max(1, cores // workers), cores)


def worker_command(argv: Sequence[str], index: int, fd: int, directory: Path, threads: WorkerThreads) -> list[str]:
    """The command line of worker ``index``: the supervisor's own (``argv``, from ``serve`` on, with its global
    options, the operator's ``--threads`` among them), its place, and the cores to share where the operator gave no
    ``--threads``."""
    command = [sys.executable, "-m", "streamer", *argv]
    command += ["--worker-index", str(index), "--listen-fd", str(fd), "--worker-dir", str(directory)]
    if threads.cores is not None:
        command += ["--threads", str(threads.threads), "--worker-cores", str(threads.cores)]
    return command


def worker_place_from(args: argparse.Namespace) -> tuple[int, WorkerPlace] | None:
    """A worker's descriptor and place from its hidden options; None for a plain ``streamer serve`` (or the
    supervisor). Raises :class:`ConfigError` for an incomplete set."""
    given = [getattr(args, "worker_index", None), getattr(args, "listen_fd", None), getattr(args, "worker_dir", None)]
    if all(value is None for value in given):
        return None
    if any(value is None for value in given):
        raise ConfigError(f"a worker needs all of {', '.join(WORKER_FLAGS)}")
    cores = getattr(args, "worker_cores", None)
    place = WorkerPlace(index=args.worker_index, workers=args.workers, directory=Path(args.worker_dir), cores=cores)
    place.validate()
    return int(args.listen_fd), place


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    # when it is due to start again after dying (None: running, or not to be restarted)
    restart_at: float | None = None
    backoff: float = RESTART_FIRST_SECONDS
    exit_codes: list[int] = field(default_factory=list)


class Supervisor:
    """The supervisor's state: the socket, the board, the workers. :meth:`run` serves until a signal, then drains."""

    def __init__(self, argv: Sequence[str], host: str, port: int, workers: int, threads: WorkerThreads) -> None:
        if workers < 2:
            raise ConfigError("a supervisor runs at least 2 workers")
        self.argv = list(argv)
        self.workers = workers
        self.threads = threads
        self.socket = socket.create_server((host, port), backlog=BACKLOG)
        self.socket.set_inheritable(True)
        self.host = host
        self.port = int(self.socket.getsockname()[1])
        self.directory = Path(tempfile.mkdtemp(prefix="streamer-workers-"))
        place = WorkerPlace(0, workers, self.directory)
        self.board = WorkerBoard.create(place.board, workers)
        self._workers = [_Worker(i) for i in range(workers)]
        self._stopping = False

    def run(self) -> int:
        """Start the workers, restart the ones that die, and on SIGTERM or SIGINT drain them all; the exit code."""
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            print(
                f"streamer: {self.workers} workers listening on ws://{self.host}:{self.port}{LISTEN_PATH}",
                file=sys.stderr,
            )
            for worker in self._workers:
                self._start(worker)
            while not self._stopping:
                self._watch(time.monotonic())
                time.sleep(POLL_SECONDS)
            return self._drain()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.close()

    def close(self) -> None:
        self.socket.close()
        self.board.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def _start(self, worker: _Worker) -> None:
        command = worker_command(self.argv, worker.index, self.socket.fileno(), self.directory, self.threads)
        worker.process = subprocess.Popen(command, pass_fds=(self.socket.fileno(),))
        worker.started = time.monotonic()
        worker.restart_at = None
        logger.info("event=worker_started worker=%d pid=%d", worker.index, worker.process.pid)

    def _watch(self, now: float) -> None:
        for worker in self._workers:
            if worker.process is not None:
                code = worker.process.poll()
                if code is None:
                    continue
                worker.process = None
                worker.exit_codes.append(code)
                self.board.publish(worker.index, STOPPED)  # it cannot say so itself
                # nor take back its last metrics: its siblings' /metrics would show them as live
                metrics_snapshot(self.directory, worker.index).unlink(missing_ok=True)
                if now - worker.started >= RESTART_RESET_SECONDS:
                    worker.backoff = RESTART_FIRST_SECONDS
                worker.restart_at = now + worker.backoff
                print(
                    f"streamer: worker {worker.index} exited with {code}; starting it again in {worker.backoff:g} s",
                    file=sys.stderr,
                )
                worker.backoff = min(worker.backoff * 2, RESTART_MAX_SECONDS)
            elif worker.restart_at is not None and now >= worker.restart_at:
                self._start(worker)

    def _drain(self) -> int:
        """SIGTERM to every worker (each drains as ``streamer serve`` does), then wait for them all."""
        print("streamer: shutting down the workers", file=sys.stderr)
        running = [w.process for w in self._workers if w.process is not None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        failed = False
        for process in running:
            # a worker still starting has no handler yet and ends by the signal itself, with nothing to drain
            failed |= process.wait() not in (0, -signal.SIGTERM)
        return 1 if failed else 0
