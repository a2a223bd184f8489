"""Which of ``streamer serve --workers N``'s workers listens (:mod:`streamer.server.balance`): the least-loaded ready
one, ties all, never a stopped or silent one, and every loading one while none is ready; how many threads each
engine call takes; the board they share."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamer.core.errors import ConfigError
from streamer.server.balance import (
    LOADING,
    STALE_SECONDS,
    STOPPED,
    Slot,
    WorkerBoard,
    WorkerPlace,
    accepts,
    engine_threads,
)

NOW = 10**12  # ns
FRESH = NOW - 1
STALE = NOW - int(STALE_SECONDS * 1e9) - 1


def slots(*loads: int, heartbeat: int = FRESH) -> list[Slot]:
    return [Slot(load, heartbeat) for load in loads]


def listening(board: list[Slot]) -> list[int]:
    return [i for i in range(len(board)) if accepts(board, i, NOW)]


def test_the_least_loaded_ready_worker_listens_and_ties_all_listen() -> None:
    assert listening(slots(3, 2, 4)) == [1]
    assert listening(slots(2, 2, 4)) == [0, 1]
    assert listening(slots(0, 0)) == [0, 1]


def test_loading_and_stopped_workers_take_nothing_while_another_is_ready() -> None:
    assert listening(slots(LOADING, 5, STOPPED)) == [1]
    assert listening(slots(STOPPED, 0)) == [1]


def test_while_no_worker_is_ready_the_loading_ones_listen_to_answer_health_checks() -> None:
    assert listening(slots(LOADING, LOADING, STOPPED)) == [0, 1]
    assert listening(slots(STOPPED, STOPPED)) == []


def test_a_worker_whose_heartbeat_stopped_no_longer_holds_the_others_back() -> None:
    board = [Slot(0, STALE), Slot(3, FRESH)]
    assert listening(board) == [0, 1]  # 0 asks with its own (stale-looking) beat: it is alive, it is the one asking
    board = [Slot(1, FRESH), Slot(3, FRESH)]
    assert listening(board) == [0]


def threads(board: list[Slot], cores: int) -> list[int]:
    return [engine_threads(board, i, NOW, cores) for i in range(len(board))]


def test_the_cores_are_divided_among_the_workers_carrying_connections() -> None:
    assert threads(slots(1, 0), cores=2) == [2, 1]  # a stream alone gets both cores; an idle worker starts on one
    assert threads(slots(4, 4), cores=2) == [1, 1]
    assert threads(slots(3, 1, 0, 2), cores=16) == [5, 5, 4, 5]
    assert threads(slots(5, 5, 5), cores=2) == [1, 1, 1]  # never none


def test_loading_stopped_and_silent_workers_leave_their_cores_to_the_others() -> None:
    assert threads(slots(2, LOADING, STOPPED), cores=3)[0] == 3
    assert threads([Slot(2, FRESH), Slot(4, STALE)], cores=2) == [2, 1]  # 1 asks: it counts itself, 0 is fresh


def test_the_board_is_shared_between_mappings_of_its_file(tmp_path: Path) -> None:
    path = tmp_path / "board"
    supervisor = WorkerBoard.create(path, 3)
    worker = WorkerBoard(path, 3)
    try:
        assert [s.load for s in worker.slots()] == [LOADING] * 3
        worker.publish(1, 7, now_ns=123)
        supervisor.publish(2, STOPPED, now_ns=456)
        assert supervisor.slots() == [Slot(LOADING, 0), Slot(7, 123), Slot(STOPPED, 456)]
        assert worker.slots() == supervisor.slots()
    finally:
        worker.close()
        supervisor.close()


def test_a_worker_place_is_checked(tmp_path: Path) -> None:
    WorkerPlace(1, 2, tmp_path).validate()
    assert WorkerPlace(1, 2, tmp_path).board == tmp_path / "board"
    WorkerPlace(1, 2, tmp_path, cores=1).validate()
    for index, workers in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(ConfigError):
            WorkerPlace(index, workers, tmp_path).validate()
    with pytest.raises(ConfigError, match="cores"):
        WorkerPlace(0, 2, tmp_path, cores=0).validate()
    with pytest.raises(ConfigError):
        WorkerBoard.create(tmp_path / "none", 0)
