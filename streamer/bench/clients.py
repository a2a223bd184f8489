"""Real-time paced clients in processes of their own, as a deployment's clients are (issue 37 and issue 39).

A client streaming in the server's process shares its event loop's interpreter and GIL: every chunk it paces, every
message it parses, runs between the engine's operators and delays them. No deployment has that cost, so a bench
that measures the speaker-felt delay puts its clients in separate processes: :class:`ClientProcesses` starts them
(``spawn``: no fork of a process that may hold threads), waits until every one is loaded, then starts them together
and collects each one's runs. ``streamer bench load`` spreads thousands of streams over several; ``streamer bench
accuracy --mode realtime`` puts its N copies in one.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from streamer.bench.harness import AudioArray, StreamRun, stream_file
from streamer.cli.event_loop import run_event_loop
from streamer.core.errors import StreamerError
from streamer.core.units import SAMPLE_RATE

__all__ = [
    "CLIENT_GRACE_SECONDS",
    "CLIENT_START_SECONDS",
    "ClientProcesses",
    "ClientResult",
    "ClientShare",
    "ClientStream",
    "add_clients_argument",
    "stream_clients",
    "stream_from_process",
    "stream_share",
]

# seconds a client process may take to start (spawn, imports) before the run is called off
CLIENT_START_SECONDS = 120.0
# seconds past the last stream's audio (and its delay) before a client process is taken for hung
CLIENT_GRACE_SECONDS = 120.0


@dataclass(frozen=True)
class ClientStream:
    """One stream a client process sends: ``samples`` (16 kHz), starting ``delay`` seconds after the common start."""

    name: str
    samples: AudioArray
    delay: float
    # the server this stream goes to, when not its share's (``streamer bench load`` spreading a process's streams
    # over several server processes, as a proxy in front of replicas would)
    url: str | None = None


@dataclass(frozen=True)
class ClientShare:
    """What one client process streams, each stream paced at ``speed`` times real time in ``chunk_ms`` chunks."""

    url: str
    streams: tuple[ClientStream, ...]
    speed: float
    chunk_ms: int
    diarize: bool = False  # every stream asks for speaker labels

    @property
    def seconds(self) -> float:
        """The client's clock from the common start to the end of its last stream's audio."""
        return max((s.delay + len(s.samples) / SAMPLE_RATE / self.speed for s in self.streams), default=0.0)


@dataclass(frozen=True)
class ClientResult:
    """What one client process brings back: every stream's run, or why the stream failed, and its CPU seconds."""

    runs: tuple[StreamRun, ...]
    failed: tuple[str, ...]
    cpu_seconds: float
    pid: int  # the client process's, never the server's
    wall_seconds: float = 0.0  # from the common start to the last stream's end, on the client's clock


async def stream_share(share: ClientShare) -> ClientResult:
    """The share's streams on the running loop (in whatever process calls it); a failed stream is named in
    ``failed``, the others go on."""

    async def one(stream: ClientStream) -> StreamRun | str:
        try:
            return await stream_file(
                stream.url or share.url,
                stream.name,
                stream.samples,
                speed=share.speed,
                chunk_ms=share.chunk_ms,
                delay=stream.delay,
                diarize=share.diarize,
            )
        except Exception as error:  # a refused or dropped connection: the stream failed, the others go on
            return f"{stream.name}: {type(error).__name__}: {error}"

    cpu = time.process_time()
    started = time.monotonic()
    outcomes = await asyncio.gather(*(one(s) for s in share.streams))
    return ClientResult(
        runs=tuple(o for o in outcomes if isinstance(o, StreamRun)),
        failed=tuple(o for o in outcomes if isinstance(o, str)),
        cpu_seconds=time.process_time() - cpu,
        pid=os.getpid(),
        wall_seconds=time.monotonic() - started,
    )


def stream_from_process(share: ClientShare) -> ClientResult:
    """The share's streams from one client process of their own, started once it is loaded. Blocking: from asyncio
    (a server in the same process), call it in a thread."""
    with ClientProcesses([share]) as clients:
        [result] = clients.run()
    return result


def add_clients_argument(parser: argparse.ArgumentParser, applies: str = "") -> None:
    """``--clients process|inline``: where a bench's paced clients stream from (:func:`stream_clients`); ``applies``
    opens its help (when it applies, say)."""
    parser.add_argument(
        "--clients",
        choices=["process", "inline"],
        default="process",
        help=f"{applies}the clients stream from a process of their own, as a deployment's do, or from the server's "
        "process, sharing its event loop and GIL (default: %(default)s)",
    )


async def stream_clients(share: ClientShare, clients: str) -> ClientResult:
    """The share's streams from a client process of their own (``clients`` "process"), or on the running loop
    ("inline"), for a server on that loop: the process is waited for on a thread, so the server keeps serving."""
    if clients == "inline":
        return await stream_share(share)
    return await asyncio.to_thread(stream_from_process, share)


def _run_share(share: ClientShare) -> ClientResult:
    """The share's streams on uvloop when it is installed (as the server runs), else asyncio's loop."""
    return run_event_loop(stream_share(share))


def _client_process(share: ClientShare, go: Any, results: Any) -> None:
    """A client process's life: say it is loaded, wait for the common start, stream its share, send the result."""
    results.put(("ready", None))
    go.wait()
    try:
        results.put(("result", _run_share(share)))
    except BaseException as error:
        results.put(("error", f"{type(error).__name__}: {error}"))


class ClientProcesses:
    """One process per share. Entering starts them and returns once every one is loaded; :meth:`run` starts them
    together and returns their results in no particular order; leaving ends any that are still alive.

    Blocking: from asyncio (a server in the same process), call :meth:`run` in a thread.
    """

    def __init__(self, shares: Sequence[ClientShare], grace_seconds: float = CLIENT_GRACE_SECONDS) -> None:
        if not shares:
            raise StreamerError("no client process to start")
        self.shares = tuple(shares)
        # seconds past the last stream's audio before a client process is taken for hung
        self.grace_seconds = grace_seconds
        context = multiprocessing.get_context("spawn")
        self._go = context.Event()
        self._results = context.Queue()
        self._workers = [
            context.Process(target=_client_process, args=(s, self._go, self._results), daemon=True) for s in self.shares
        ]

    def __enter__(self) -> ClientProcesses:
        try:
            for worker in self._workers:
                worker.start()
            for _ in self._workers:
                self._expect("ready", CLIENT_START_SECONDS)
        except BaseException:
            self._end()
            raise
        return self

    def run(self) -> list[ClientResult]:
        """Start every process's streams at once; their results once all have ended."""
        self._go.set()
        timeout = max(s.seconds for s in self.shares) + self.grace_seconds
        return [self._expect("result", timeout) for _ in self._workers]

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._end()

    def _end(self) -> None:
        for worker in self._workers:
            if worker.pid is None:
                continue
            worker.join(5)
            if worker.is_alive():
                worker.kill()
                worker.join()

    def _expect(self, kind: str, timeout: float) -> Any:
        """The next message of a client process, which must be ``kind``; raises when one failed, died or hung."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                got, payload = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [w for w in self._workers if w.exitcode not in (None, 0)]
                if dead:
                    raise StreamerError(f"a client process died (exit code {dead[0].exitcode})") from None
                if time.monotonic() > deadline:
                    raise StreamerError(f"no {kind} from a client process after {timeout:.0f} s") from None
                continue
            if got == "error":
                raise StreamerError(f"a client process failed: {payload}")
            if got != kind:
                raise StreamerError(f"a client process said {got!r} where {kind!r} was due")
            return payload
