"""Workers on one listening socket (:mod:`streamer.server.listener`): they take connections in turn by load, a
draining one takes none, and each one's ``/metrics`` holds every worker's, labelled. Two servers in this process stand
in for two worker processes: they share the socket and the board exactly as the processes do."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from streamer.app import App
from streamer.engine.fake import ScriptedEngine
from streamer.server.balance import STOPPED, WorkerBoard, WorkerPlace, accepts
from streamer.server.serve import Server
from tests.helpers import WORDS, config, http_get, until


@asynccontextmanager
async def workers(
    directory: Path, count: int, cores: int | None = None
) -> AsyncIterator[tuple[list[Server], WorkerBoard, int]]:
    """``count`` servers on one socket and one board, ready and settled (each listening as the board says); ``cores``
    shared out by load, or each engine's threads fixed."""
    shared = socket.create_server(("127.0.0.1", 0))
    board = WorkerBoard.create(directory / "board", count)
    try:
        async with AsyncExitStack() as stack:
            servers: list[Server] = []
            for index in range(count):
                place = WorkerPlace(index, count, directory, cores)
                worker_config = dataclasses.replace(config(), listen_fd=shared.fileno(), worker=place)
                servers.append(await stack.enter_async_context(App(worker_config, ScriptedEngine(WORDS))))
            await settled(servers, board)
            yield servers, board, int(shared.getsockname()[1])
    finally:
        board.close()
        shared.close()


async def settled(servers: Sequence[Server], board: WorkerBoard) -> None:
    """Until every server has published its connections and listens exactly when the board says it should."""

    def done() -> bool:
        slots = board.slots()
        now = time.monotonic_ns()
        return all(
            slots[i].load == (s.open_connections if not s.draining else STOPPED)
            and s.accepting == accepts(slots, i, now)
            for i, s in enumerate(servers)
        )

    await until(done)


async def test_workers_take_connections_in_turn(tmp_path: Path) -> None:
    async with workers(tmp_path, 2) as (servers, board, port), AsyncExitStack() as clients:
        opened: list[ClientConnection] = []
        for n in range(1, 7):
            opened.append(await clients.enter_async_context(connect(f"ws://127.0.0.1:{port}/v1/listen")))
            await until(lambda n=n: sum(len(s.sessions) for s in servers) == n)  # type: ignore[misc]
            await settled(servers, board)
            loads = sorted(len(s.sessions) for s in servers)
            assert loads[1] - loads[0] <= 1, loads
        assert [len(s.sessions) for s in servers] == [3, 3]
        # a worker whose connection ends is the lighter one: it alone listens, and the next connection is its
        await opened[0].close()
        await until(lambda: sum(len(s.sessions) for s in servers) == 5)
        await settled(servers, board)
        assert sorted((len(s.sessions), s.accepting) for s in servers) == [(2, True), (3, False)]
        await clients.enter_async_context(connect(f"ws://127.0.0.1:{port}/v1/listen"))
        await until(lambda: sum(len(s.sessions) for s in servers) == 6)
        assert [len(s.sessions) for s in servers] == [3, 3]


async def test_a_draining_worker_takes_nothing_new(tmp_path: Path) -> None:
    async with workers(tmp_path, 2) as (servers, board, port), AsyncExitStack() as clients:
        await servers[0].shutdown()
        await settled(servers, board)
        assert board.slots()[0].load == STOPPED and not servers[0].accepting
        for n in range(1, 4):
            await clients.enter_async_context(connect(f"ws://127.0.0.1:{port}/v1/listen"))
            await until(lambda n=n: len(servers[1].sessions) == n)  # type: ignore[misc]
            await settled(servers, board)


def engine_threads(servers: Sequence[Server]) -> list[int | None]:
    """What each worker's scheduler would ask for its next engine call."""
    asked = []
    for server in servers:
        assert server.scheduler is not None and server.scheduler.threads is not None
        asked.append(server.scheduler.threads())
    return asked


async def test_a_workers_engine_takes_the_cores_its_idle_siblings_leave(tmp_path: Path) -> None:
    async with workers(tmp_path, 2, cores=2) as (servers, board, port), AsyncExitStack() as clients:
        assert engine_threads(servers) == [2, 2]  # nobody busy: whoever decodes first has the machine
        await clients.enter_async_context(connect(f"ws://127.0.0.1:{port}/v1/listen"))
        await until(lambda: sum(len(s.sessions) for s in servers) == 1)
        await settled(servers, board)
        assert sorted(zip((len(s.sessions) for s in servers), engine_threads(servers), strict=True)) == [(0, 1), (1, 2)]
        await clients.enter_async_context(connect(f"ws://127.0.0.1:{port}/v1/listen"))
        await until(lambda: sum(len(s.sessions) for s in servers) == 2)
        await settled(servers, board)
        assert engine_threads(servers) == [1, 1]  # both busy: a core each
    async with workers(tmp_path, 2) as (servers, _, _):
        assert engine_threads(servers) == [None, None]  # the operator's --threads: never changed


async def test_each_workers_metrics_hold_every_worker(tmp_path: Path) -> None:
    async with workers(tmp_path, 2) as (_, _, port):
        await until(lambda: all((tmp_path / f"metrics-{i}.prom").exists() for i in range(2)))
        status, _, body = await http_get(port, "/metrics")
        assert status == 200
        for index in ("0", "1"):
            assert f'streamer_ready{{worker="{index}"}} 1.0' in body
            assert f'streamer_active_sessions{{worker="{index}"}} 0.0' in body
        assert body.count("# TYPE streamer_active_sessions gauge") == 1


async def test_a_worker_shakes_hands_as_a_plain_server_does(tmp_path: Path) -> None:
    """The connections a worker accepts itself get the server's websockets options: the subprotocol it selects, its
    routes, and its message size limit (websockets closes 1009 above it)."""
    async with workers(tmp_path, 2) as (servers, _, port):
        url = f"ws://127.0.0.1:{port}/v1/listen"
        async with connect(url, subprotocols=[Subprotocol("realtime")]) as ws:
            assert ws.subprotocol == "realtime"
        status, _, _ = await http_get(port, "/nowhere")
        assert status == 404
        too_big = servers[0].config.max_message_bytes + 1
        ws = await connect(url, max_size=None)  # no `async with`: closing a closed client again trips asyncio 3.11
        await ws.send(b"\0" * too_big)
        with pytest.raises(ConnectionClosed):
            while True:  # what the session sent before the close
                await ws.recv()
        assert ws.close_code == 1009
