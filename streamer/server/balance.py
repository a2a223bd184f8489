"""Several worker processes on one listening port (``streamer serve --workers N``): which of them takes the next
connection.

The workers share one listening socket, and the kernel hands a new connection to whichever of them calls ``accept``
first: at eight streams over two workers a 6/2 split is about as likely as 4/4, and the busier engine then holds the
tail. So each worker publishes its load on a :class:`WorkerBoard` (a small file the supervisor creates, mapped by
every worker: a slot each, its live connections and a heartbeat) and listens only while :func:`accepts` says so:
while no live, ready worker carries fewer connections than it does. A worker whose heartbeat stopped (a process that
died, or an event loop stuck for longer than :data:`STALE_SECONDS`) no longer counts, so one stuck worker cannot keep
the others from accepting. Before any worker's model is loaded, all of them listen: ``/readyz`` and ``/healthz`` must be
answered while the models load.

The same board shares out the cores (:func:`engine_threads`): when the operator left ``--threads`` to the supervisor,
each worker's engine runs on the cores divided among the workers that carry connections now, so one stream alone on
one worker gets every core (as one ``streamer serve`` would give it) and eight over two workers get one core each.

The decisions (:func:`accepts`, :func:`engine_threads`) are pure functions of the board's slots and the clock;
:class:`WorkerBoard` is the shared memory and nothing else. The server (:class:`streamer.server.serve.Server`)
publishes and opens or pauses its listener; the supervisor (:mod:`streamer.cli.workers`) creates the board and marks
a dead worker's slot.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from streamer.core.errors import ConfigError

__all__ = [
    "BOARD_FILE",
    "LOADING",
    "STALE_SECONDS",
    "STOPPED",
    "Slot",
    "WorkerBoard",
    "WorkerPlace",
    "accepts",
    "engine_threads",
    "metrics_snapshot",
]

# a slot's load while the worker's model is loading (it answers /readyz, and streams get "not ready")
LOADING = -1
# a slot's load once the worker drains or dies (the supervisor writes it for a dead one): it takes nothing new
STOPPED = -2
# a worker whose heartbeat is older than this is left out of the comparison (its process died, or its event loop is
# stuck): the others go on accepting. A worker beats every BALANCE_INTERVAL_SECONDS
STALE_SECONDS = 2.0
# how often a worker publishes its load and reconsiders whether to listen
BALANCE_INTERVAL_SECONDS = 0.05
# the board's file in the workers' directory
BOARD_FILE = "board"

# a slot: the load (live connections, or LOADING / STOPPED) and the heartbeat (CLOCK_MONOTONIC in ns, which every
# process on the machine reads alike)
_SLOT = struct.Struct("<qq")


@dataclass(frozen=True)
class WorkerPlace:
    """Where a worker stands among its siblings: its index, how many there are, and their shared directory (the board
    and each worker's metrics snapshot)."""

    index: int
    workers: int
    directory: Path
    # the cores the workers share out by load (:func:`engine_threads`); None: each engine keeps the --threads it got
    cores: int | None = None

    def validate(self) -> None:
        if self.workers < 1:
            raise ConfigError("workers must be at least 1")
        if not 0 <= self.index < self.workers:
            raise ConfigError(f"worker index must be between 0 and {self.workers - 1}, not {self.index}")
        if self.cores is not None and self.cores < 1:
            raise ConfigError("the workers' cores must be at least 1")

    @property
    def board(self) -> Path:
        return self.directory / BOARD_FILE


def metrics_snapshot(directory: Path, index: int) -> Path:
    """Where worker ``index`` of the workers sharing ``directory`` leaves its metrics for its siblings' ``/metrics``."""
    return directory / f"metrics-{index}.prom"


@dataclass(frozen=True)
class Slot:
    """One worker's entry on the board."""

    load: int
    heartbeat_ns: int


def accepts(slots: Sequence[Slot], index: int, now_ns: int) -> bool:
    """Whether worker ``index`` should listen now. It should when it is ready (its load is a count, not
    :data:`LOADING` or :data:`STOPPED`) and no other ready worker whose heartbeat is fresh carries less; ties all
    listen. While no worker is ready, the loading ones listen (to answer health checks). A worker never counts its own
    heartbeat as stale: it is the one asking."""
    mine = slots[index].load
    ready = [slot.load for i, slot in enumerate(slots) if slot.load >= 0 and (i == index or _beating(slot, now_ns))]
    if not ready:
        return mine == LOADING
    return mine >= 0 and mine <= min(ready)


def engine_threads(slots: Sequence[Slot], index: int, now_ns: int, cores: int) -> int:
    """The threads for worker ``index``'s next engine call: the ``cores`` divided among the workers carrying
    connections (ready, with a fresh heartbeat and a load above zero), this one counted whatever its own load (it is
    about to decode), at least one. Two workers on two cores: both busy, one thread each (a second thread each would
    only contend for the cores); one alone busy, both threads."""
    busy = 1 + sum(1 for i, slot in enumerate(slots) if i != index and slot.load > 0 and _beating(slot, now_ns))
    return max(1, cores // busy)


def _beating(slot: Slot, now_ns: int) -> bool:
    """Whether the slot's heartbeat is fresh: its worker counts for the others' decisions."""
    return now_ns - slot.heartbeat_ns <= int(STALE_SECONDS * 1e9)


class WorkerBoard:
    """The workers' slots in a file mapped into every worker (and the supervisor). Writes of a slot are two aligned
    8-byte stores; a reader that sees one half-updated slot decides once on it, and the next beat corrects it."""

    def __init__(self, path: Path, workers: int) -> None:
        self.workers = workers
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, _SLOT.size * workers)
        finally:
            os.close(fd)

    @classmethod
    def create(cls, path: Path, workers: int) -> WorkerBoard:
        """A new board for ``workers`` workers, every slot :data:`LOADING` with no heartbeat yet."""
        if workers < 1:
            raise ConfigError("workers must be at least 1")
        path.write_bytes(_SLOT.pack(LOADING, 0) * workers)
        return cls(path, workers)

    def publish(self, index: int, load: int, now_ns: int | None = None) -> None:
        """Worker ``index``'s load, with a heartbeat of now (or ``now_ns``)."""
        heartbeat = time.monotonic_ns() if now_ns is None else now_ns
        _SLOT.pack_into(self._map, _SLOT.size * index, load, heartbeat)

    def slots(self) -> list[Slot]:
        return [Slot(*_SLOT.unpack_from(self._map, _SLOT.size * i)) for i in range(self.workers)]

    def close(self) -> None:
        self._map.close()
