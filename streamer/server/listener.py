"""The server's listening socket: its own on ``host:port``, or, for one of ``streamer serve --workers N``'s workers, the
socket the supervisor bound and every worker shares, from which the worker accepts only while its siblings' loads
say so (:mod:`streamer.server.balance`).

A plain server lets websockets listen (:class:`Listener`). A worker accepts itself (:class:`SharedListener`): it
watches the shared descriptor and takes one connection at a time, counting it before it takes the next, so that a
burst of connections pending together is shared out rather than taken by whichever worker woke first (asyncio and
uvloop both accept every pending connection in one go). Each connection it takes goes to a websockets server that
never listens, as websockets' own accept would hand it there; stopping to accept is leaving the descriptor unwatched,
so no connection is ever caught half-accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Sequence

from websockets.asyncio.server import Server as WebSocketServer
from websockets.asyncio.server import ServerConnection
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from streamer.core.errors import InvalidState
from streamer.server.balance import (
    BALANCE_INTERVAL_SECONDS,
    STOPPED,
    WorkerBoard,
    WorkerPlace,
    accepts,
    engine_threads,
    metrics_snapshot,
)

__all__ = [
    "METRICS_SNAPSHOT_SECONDS",
    "Balancer",
    "Listener",
    "SharedListener",
    "read_metrics_snapshots",
    "websocket_connection",
    "write_metrics_snapshot",
]

logger = logging.getLogger(__name__)

# how often a worker writes its metrics for its siblings' /metrics (a scrape sees the others as of this long ago)
METRICS_SNAPSHOT_SECONDS = 1.0

# opens a websockets server: on the configured host and port (None), or on this socket
OpenServer = Callable[[socket.socket | None], Awaitable[WebSocketServer]]
# a new connection for a websockets server (what websockets' own accept constructs): ServerConnection's constructor
# over a sans-I/O ServerProtocol; the server builds it with its options (streamer.server.serve.Server)
ConnectionFactory = Callable[[WebSocketServer], ServerConnection]


class Listener:
    """A plain server's listening socket on host and port: websockets accepts."""

    def __init__(self, open_server: OpenServer) -> None:
        self._open = open_server
        self._server: WebSocketServer | None = None
        self._port: int | None = None
        self._accepting = False

    @property
    def port(self) -> int:
        """The port listened on (still known once the socket is closed)."""
        if self._port is None:
            raise InvalidState("the server is not started")
        return self._port

    @property
    def accepting(self) -> bool:
        return self._accepting

    async def start(self) -> None:
        if self._server is not None:
            raise InvalidState("the server is already started")
        self._server = await self._open(None)
        self._port = int(self._server.sockets[0].getsockname()[1])
        self._accepting = True

    def stop_accepting(self) -> None:
        """A shutdown's first step: close the listening socket; the connections go on."""
        self._accepting = False
        if self._server is not None:
            self._server.server.close()  # asyncio's: the listening socket only, not the connections

    async def close(self, code: int) -> None:
        """A shutdown's last step: close every connection left (with ``code``) and wait for their handlers."""
        self._accepting = False
        if self._server is not None:
            self._server.close(code=code)
            await self._server.wait_closed()


class SharedListener:
    """A worker's share of the supervisor's socket (descriptor ``fd``): :meth:`resume` and :meth:`pause` watch it or
    not; while watched, each readable event takes connections one at a time as long as ``may_accept()`` holds (the
    balancing's verdict with the connections taken so far counted: :attr:`pending` until their connection is made)."""

    def __init__(self, open_server: OpenServer, fd: int, connection: ConnectionFactory) -> None:
        self._open = open_server
        self._socket = socket.socket(fileno=os.dup(fd))
        self._socket.setblocking(False)
        self._connection = connection
        self._server: WebSocketServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watching = False
        self._stopped = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.may_accept: Callable[[], bool] = lambda: True
        # connections taken from the socket whose websockets connection is not made yet (they count as load)
        self.pending = 0

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    @property
    def accepting(self) -> bool:
        return self._watching

    async def start(self) -> None:
        """Make the websockets server the connections go to; accepting from the shared socket waits for
        :meth:`resume`."""
        if self._server is not None:
            raise InvalidState("the server is already started")
        self._loop = asyncio.get_running_loop()
        # websockets answers 503 unless its server is serving: it serves on a Unix socket of an autobound abstract
        # name (Linux), which nobody is told and which leaves no file; a local process that found it would be served
        # as through the port, auth and limits alike
        idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        idle.bind("")
        self._server = await self._open(idle)

    def resume(self) -> None:
        if not self._watching and not self._stopped and self._loop is not None:
            self._loop.add_reader(self._socket.fileno(), self._readable)
            self._watching = True

    def pause(self) -> None:
        if self._watching and self._loop is not None:
            self._loop.remove_reader(self._socket.fileno())
            self._watching = False

    def stop_accepting(self) -> None:
        self._stopped = True
        self.pause()

    async def close(self, code: int) -> None:
        self.stop_accepting()
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task
        if self._server is not None:
            self._server.close(code=code)
            await self._server.wait_closed()
        self._socket.close()

    def _readable(self) -> None:
        """Take connections one by one while the balancing lets this worker (a sibling may take the rest)."""
        while self._watching and self.may_accept():
            try:
                connection, _ = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return  # a sibling took it
            except OSError as error:  # out of descriptors, say: the next readable event tries again
                logger.warning("event=accept_failed error=%r", error)
                return
            connection.setblocking(False)
            self.pending += 1
            task = asyncio.ensure_future(self._hand_over(connection))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._watching:
            self.pause()  # its share is taken: the balancing resumes it

    async def _hand_over(self, connection: socket.socket) -> None:
        """Give an accepted connection to the websockets server, as its own accept would."""
        assert self._loop is not None and self._server is not None
        server = self._server
        made = False

        def factory() -> ServerConnection:
            nonlocal made
            made = True
            self.pending -= 1  # counted from here on as an open connection
            return self._connection(server)

        try:
            await self._loop.connect_accepted_socket(factory, connection)
        except Exception as error:  # the client went away before its transport was up
            logger.info("event=accept_dropped error=%r", error)
            connection.close()
            if not made:
                self.pending -= 1


def websocket_connection(
    create: Callable[..., ServerConnection],
    select_subprotocol: Callable[[ServerConnection, Sequence[Subprotocol]], Subprotocol | None],
    max_size: int,
    log: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> ConnectionFactory:
    """What websockets' own accept constructs for each connection (``serve``'s protocol factory), from its public
    parts: a sans-I/O :class:`ServerProtocol` with the server's options (no origins check and no extensions here, as
    the server asks of ``serve``: it checks origins itself, and takes no compression) inside ``create`` (the server's
    ``create_connection`` class), whose ``connection_made`` starts the websockets server's handler."""

    def factory(server: WebSocketServer) -> ServerConnection:
        def choose(protocol: ServerProtocol, offered: Sequence[Subprotocol]) -> Subprotocol | None:
            return select_subprotocol(connection, offered)

        protocol = ServerProtocol(select_subprotocol=choose, max_size=max_size, logger=log)
        connection = create(protocol, server)
        return connection

    return factory


class Balancer:
    """A worker's side of the balancing (:mod:`streamer.server.balance`): it publishes the worker's load (``load()``:
    its open connections, or :data:`~streamer.server.balance.LOADING`) and watches the shared socket or not by it,
    every :data:`~streamer.server.balance.BALANCE_INTERVAL_SECONDS` (:meth:`run`) and before each connection the
    listener takes (:meth:`may_accept`)."""

    def __init__(
        self, listener: SharedListener, place: WorkerPlace, board: WorkerBoard, load: Callable[[], int]
    ) -> None:
        self.listener = listener
        self.place = place
        self.board = board
        self._load = load
        self._stopped = False
        listener.may_accept = self.may_accept
        # the supervisor: a worker whose supervisor died (SIGKILL, say) drains and exits rather than serve on alone
        self._parent = os.getppid()
        self._orphaned = False
        self._closed = False

    def may_accept(self) -> bool:
        """Publish the load now (the connections being taken counted) and say whether this worker may take another."""
        if self._stopped:
            return False
        self.board.publish(self.place.index, self._load())
        return accepts(self.board.slots(), self.place.index, time.monotonic_ns())

    def engine_threads(self) -> int | None:
        """The threads for this worker's next engine call, its share of the cores by its siblings' load
        (:func:`~streamer.server.balance.engine_threads`); None where the threads are fixed (the operator gave
        ``--threads``, so the place has no cores to share) or the board is closed."""
        if self.place.cores is None or self._closed:
            return None
        return engine_threads(self.board.slots(), self.place.index, time.monotonic_ns(), self.place.cores)

    async def run(self, metrics: Callable[[], str], stopping: asyncio.Event) -> None:
        """Until ``stopping`` is set: publish the load, listen while
        :func:`~streamer.server.balance.accepts` says so, and write ``metrics()`` for the siblings' ``/metrics`` every
        :data:`METRICS_SNAPSHOT_SECONDS`. On the way out it marks its slot stopped."""
        snapshot_due = 0.0
        try:
            while not stopping.is_set():
                if os.getppid() != self._parent and not self._orphaned:
                    self._orphaned = True
                    logger.warning("event=supervisor_gone worker=%d", self.place.index)
                    os.kill(os.getpid(), signal.SIGTERM)  # the process's own drain, as streamer serve's SIGTERM
                if self.may_accept():
                    self.listener.resume()
                else:
                    self.listener.pause()
                now = time.monotonic()
                if now >= snapshot_due:
                    write_metrics_snapshot(self.place, metrics())
                    snapshot_due = now + METRICS_SNAPSHOT_SECONDS
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), BALANCE_INTERVAL_SECONDS)
        finally:
            self._stopped = True
            self.board.publish(self.place.index, STOPPED)

    def close(self) -> None:
        """Unmap the board (after :meth:`run` has ended)."""
        self._stopped = True
        self._closed = True
        self.board.close()


def write_metrics_snapshot(place: WorkerPlace, text: str) -> None:
    """This worker's exposition, for its siblings to merge into their ``/metrics`` (written aside, then renamed: a
    reader sees the old snapshot or the new one, whole)."""
    path = metrics_snapshot(place.directory, place.index)
    partial = path.with_suffix(".tmp")
    partial.write_text(text)
    os.replace(partial, path)


def read_metrics_snapshots(place: WorkerPlace, own: str) -> dict[str, str]:
    """Every worker's exposition by index, in index order: ``own`` (read now) for this worker, the last snapshot for
    the others (none yet: left out)."""
    texts: dict[str, str] = {}
    for index in range(place.workers):
        if index == place.index:
            texts[str(index)] = own
            continue
        try:
            texts[str(index)] = metrics_snapshot(place.directory, index).read_text()
        except FileNotFoundError:
            continue
    return texts
